#!/usr/bin/env python3
"""Checks that the README and the pages under docs/ hold together.

    tools/check_docs.py [ROOT] [--troupe BINARY] [--max-readme-lines N]

ROOT is the source tree (default: this one). Prints each fault as FILE:LINE:
what is wrong, and exits 1 if there is one:
- the README is at most N lines (default 220) and its set-up section holds
  exactly the two set-up commands;
- every page under docs/ is linked from the README directly, and every
  relative link of the README and the pages (pictures included) leads to a
  file, its #anchor to a heading there;
- every fenced block is labelled (sh, python, text or textproto), so no shell
  or Python block escapes its check (python blocks run in
  python/tests/test_docs.py);
- in each sh block: every `troupe VERB` (also ./troupe, build/release/cli/
  troupe, after mpirun or xvfb-run) names a verb of the CLI, and each --flag
  after it is one of that verb's (from `BINARY VERB --help` when --troupe is
  given, else from cli/'s sources; options after --slurm go to sbatch);
  `troupe bench NAME` a benchmark of bench/registry.cc; every repository
  path named exists; each --flag of a repository script, or of a program
  under build/PRESET/DIR/, appears in its source;
- tools/check_layers.sh cites docs/design.md, and that page's layer table
  says what the script allows each folder to include;
- every table of figures in the README and docs/benchmarks/ is a block
  generated from docs/benchmarks/data/*.json and still what the JSON says,
  or says where its figures come from (tools/bench_docs.py --check).
ctest runs it as Docs.ReadmeAndPagesHoldTogether; Docs.CheckRefusesBrokenDocs
(tests/check_docs_test.py) checks that it fails on broken trees.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

LANGUAGES = {"sh", "python", "text", "textproto"}
SETUP_COMMANDS = ["./troupe run configs/cartpole_swingup_state.textproto", "./tools/test.sh"]
REPO_TOP = ("tools", "bench", "configs", "tests", "python", "docs", "envs", "cli", "engine", "proto", "agents",
            "actors", "learner", "launch", "replay", "gan", "viz", "common")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
LAUNCHERS = {"mpirun", "mpiexec", "srun", "xvfb-run", "nice", "env", "time", "sudo"}  # run troupe after their options


class Checker:
    def __init__(self, root, troupe, max_readme_lines):
        self.root = os.path.abspath(root)
        self.troupe = troupe
        self.max_readme_lines = max_readme_lines
        self.faults = []
        self.commands_checked = 0
        self._verb_flags = None
        self._help_cache = {}

    def fault(self, path, line, message):
        self.faults.append(f"{os.path.relpath(path, self.root)}:{line}: {message}")

    # --- the pages -------------------------------------------------------

    def pages(self):
        found = []
        for folder, _, files in os.walk(os.path.join(self.root, "docs")):
            found += [os.path.join(folder, f) for f in files if f.endswith(".md")]
        return sorted(found)

    @staticmethod
    def read(path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    @staticmethod
    def fences(text):
        """(line number, language, body) of each fenced block."""
        blocks, lines, i = [], text.split("\n"), 0
        while i < len(lines):
            m = re.match(r"^(\s*)```(.*)$", lines[i])
            if m:
                start, language, body = i + 1, m.group(2).strip(), []
                i += 1
                while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                    body.append(lines[i])
                    i += 1
                blocks.append((start, language, "\n".join(body)))
            i += 1
        return blocks

    @staticmethod
    def without_fences(text):
        """The text with fenced blocks blanked (line numbers kept)."""
        out, inside = [], False
        for line in text.split("\n"):
            if re.match(r"^\s*```", line):
                inside = not inside
                out.append("")
            else:
                out.append("" if inside else line)
        return out

    @staticmethod
    def slug(heading):
        s = heading.strip().lower().replace("`", "")
        s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
        s = re.sub(r"[^\w\- ]", "", s)
        return s.replace(" ", "-")

    def anchors(self, path):
        seen, result = {}, set()
        for line in self.without_fences(self.read(path)):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = self.slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                result.add(base if n == 0 else f"{base}-{n}")
        return result

    def links(self, path):
        """(line, target) of each inline link or picture outside code."""
        found = []
        for number, line in enumerate(self.without_fences(self.read(path)), 1):
            line = re.sub(r"`[^`]*`", "", line)
            for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
                found.append((number, m.group(1)))
        return found

    def check_links(self, path):
        targets = set()
        for number, target in self.links(path):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(resolved):
                self.fault(path, number, f"link to {target}: no such file {os.path.relpath(resolved, self.root)}")
                continue
            targets.add(resolved)
            if anchor and resolved.endswith(".md") and anchor not in self.anchors(resolved):
                self.fault(path, number, f"link to {target}: no heading #{anchor} in {os.path.relpath(resolved, self.root)}")
        return targets

    def check_readme(self, readme):
        text = self.read(readme)
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        if lines > self.max_readme_lines:
            self.fault(readme, lines, f"the README has {lines} lines; at most {self.max_readme_lines} (move the rest into docs/)")
        # The set-up section: exactly the two set-up commands.
        m = re.search(r"^## Set-up.*?$(.*?)(?=^## )", text, flags=re.S | re.M)
        if not m:
            self.fault(readme, 1, "no '## Set-up' section")
        else:
            commands = [body.strip() for _, language, body in self.fences(m.group(1)) if language == "sh"]
            if commands != SETUP_COMMANDS:
                line = text[:m.start()].count("\n") + 1
                self.fault(readme, line, f"the set-up section's commands are {commands}, not {SETUP_COMMANDS}")

    # --- fenced blocks and commands -----------------------------------------

    def check_blocks(self, path):
        for line, language, body in self.fences(self.read(path)):
            if language not in LANGUAGES:
                self.fault(path, line, f"fenced block labelled '{language}': label it one of {sorted(LANGUAGES)}")
            elif language == "sh":
                self.check_sh(path, line, body)

    @staticmethod
    def logical_lines(body, first_line):
        """(line number, text) with backslash continuations joined."""
        result, pending, start = [], "", first_line
        for offset, line in enumerate(body.split("\n")):
            if not pending:
                start = first_line + 1 + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            result.append((start, pending + line))
            pending = ""
        if pending:
            result.append((start, pending))
        return result

    @staticmethod
    def tokens(text):
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)

    def check_sh(self, path, first_line, body):
        for line, text in self.logical_lines(body, first_line):
            try:
                tokens = self.tokens(text)
            except ValueError as e:
                self.fault(path, line, f"cannot parse the shell line ({e}): {text.strip()}")
                continue
            segment = []
            for token in tokens + [";"]:
                if token in SEPARATORS:
                    if segment:
                        self.check_command(path, line, segment)
                    segment = []
                else:
                    segment.append(token)

    def repo_path(self, token):
        """The repository path a token names, or None."""
        token = token[2:] if token.startswith("./") else token
        top = token.split("/", 1)[0]
        if top not in REPO_TOP or "/" not in token:
            return None
        if re.search(r"[<>*$]|[A-Z]{3,}", token):
            return None  # a placeholder (configs/<task>.textproto, DIR, ...)
        return token

    def check_command(self, path, line, words):
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]  # VAR=value before the command
        if not words:
            return
        self.commands_checked += 1
        # Every repository path named exists.
        for word in words:
            value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
            repo = self.repo_path(value)
            if repo and not os.path.exists(os.path.join(self.root, repo)):
                self.fault(path, line, f"`{' '.join(words)}`: no {repo} in the repository")
        # troupe VERB --flags
        for i, word in enumerate(words):
            if os.path.basename(word) == "troupe" and (i == 0 or words[0] in LAUNCHERS):
                self.check_troupe(path, line, words[i + 1:])
                return
        # A repository script or a built program, and its flags.
        command = words[0]
        rest = words[1:]
        if command in ("python3", "python", "bash", "sh") and rest:
            command, rest = rest[0], rest[1:]
        flags = [w.split("=", 1)[0] for w in rest if w.startswith("--") and len(w) > 2]
        built = re.match(r"^(?:\./)?build/[a-z0-9_-]+/([a-z_]+)/([A-Za-z0-9_]+)$", command)
        if built:
            folder, program = built.groups()
            cmake = os.path.join(self.root, folder, "CMakeLists.txt")
            if not os.path.exists(cmake) or not re.search(
                    r"(add_executable|troupe_test)\(\s*" + re.escape(program) + r"\b", self.read(cmake)):
                self.fault(path, line, f"`{command}`: no program {program} in {folder}/CMakeLists.txt")
                return
            sources = "".join(self.read(os.path.join(self.root, folder, f))
                              for f in os.listdir(os.path.join(self.root, folder)) if f.endswith((".cc", ".h")))
            for flag in flags:
                if flag not in sources:
                    self.fault(path, line, f"`{command}`: {flag} is in no source under {folder}/")
            return
        repo = self.repo_path(command)
        if repo and os.path.isfile(os.path.join(self.root, repo)):
            source = self.read(os.path.join(self.root, repo))
            for flag in flags:
                if flag not in source:
                    self.fault(path, line, f"`{repo}`: {flag} is not one of its options")

    def verb_flags(self):
        """{verb: set of --flags}, from the CLI's sources."""
        if self._verb_flags is not None:
            return self._verb_flags
        cli = os.path.join(self.root, "cli")
        security = set()
        security_file = os.path.join(cli, "security_flags.h")
        if os.path.exists(security_file):
            security = set(re.findall(r"--[a-z0-9][a-z0-9-]*", "\n".join(
                re.findall(r'add_(?:option|flag)\(\s*"([^"]*)"', self.read(security_file)))))
        verbs = {}
        for name in sorted(os.listdir(cli)) if os.path.isdir(cli) else []:
            if not name.endswith(".cc"):
                continue
            text = self.read(os.path.join(cli, name))
            starts = [(m.start(), m.group(1)) for m in re.finditer(r'add_subcommand\(\s*"([a-z-]+)"', text)]
            for n, (start, verb) in enumerate(starts):
                end = starts[n + 1][0] if n + 1 < len(starts) else len(text)
                part = text[start:end]
                names = re.findall(r'add_(?:option|flag)\(\s*"([^"]*)"', part)
                flags = set(re.findall(r"--[a-z0-9][a-z0-9-]*", "\n".join(names))) | {"--help"}
                if re.search(r"security(?:\.|->)AddTo\(", part):
                    flags |= security
                verbs[verb] = flags
        self._verb_flags = verbs
        return verbs

    def help_flags(self, verb):
        if verb not in self._help_cache:
            done = subprocess.run([self.troupe, verb, "--help"], capture_output=True, text=True, timeout=60)
            out = done.stdout + done.stderr
            if done.returncode != 0 or "is not" in out and verb not in out:
                self._help_cache[verb] = None
            else:
                self._help_cache[verb] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out)) | {"--help"}
        return self._help_cache[verb]

    def bench_names(self):
        registry = os.path.join(self.root, "bench", "registry.cc")
        return set(re.findall(r'^\s*\{"([a-z_-]+)",', self.read(registry), flags=re.M)) if os.path.exists(registry) else set()

    def check_troupe(self, path, line, rest):
        if not rest:
            return  # troupe alone
        verb = rest[0]
        known = self.verb_flags()
        if verb not in known:
            self.fault(path, line, f"`troupe {verb}`: no such verb (the CLI has: {', '.join(sorted(known))})")
            return
        flags = self.help_flags(verb) if self.troupe else known[verb]
        if flags is None:
            self.fault(path, line, f"`troupe {verb} --help` failed")
            return
        if verb == "bench" and len(rest) > 1 and not rest[1].startswith("-"):
            names = self.bench_names()
            if rest[1] not in names:
                self.fault(path, line, f"`troupe bench {rest[1]}`: no such benchmark (bench/registry.cc has: "
                           f"{', '.join(sorted(names))})")
        for word in rest[1:]:
            if not word.startswith("--") or len(word) == 2:
                continue
            flag = word.split("=", 1)[0]
            if flag not in flags:
                self.fault(path, line, f"`troupe {verb}`: {flag} is not one of its options")
            if flag == "--slurm":
                break  # what follows goes to sbatch

    # --- the layer table ----------------------------------------------------

    def check_layers(self):
        script = os.path.join(self.root, "tools", "check_layers.sh")
        if not os.path.exists(script):
            return
        design = os.path.join(self.root, "docs", "design.md")
        text = self.read(script)
        if "docs/design.md" not in text:
            self.fault(script, 1, "does not cite docs/design.md, the page with its layer table")
        if not os.path.exists(design):
            self.fault(script, 1, "cites docs/design.md, which does not exist")
            return
        allowed = {m.group(1): set(m.group(2).split()) for m in re.finditer(r'^\s*\[([a-z_]+)\]="([^"]*)"', text, re.M)}
        table, table_line = {}, {}
        inside = False
        for number, line in enumerate(self.read(design).split("\n"), 1):
            if re.match(r"^## Layers\s*$", line):
                inside = True
            elif line.startswith("## "):
                inside = False
            elif inside:
                m = re.match(r"^\|\s*`([a-z_]+)/`\s*\|.*\|\s*([^|]*?)\s*\|\s*$", line)
                if m:
                    includes = m.group(2)
                    table[m.group(1)] = set() if includes == "nothing" else {w.strip() for w in includes.split(",")}
                    table_line[m.group(1)] = number
        if not table:
            self.fault(design, 1, "no layer table under '## Layers' (| `folder/` | holds | may include |)")
            return
        for folder in sorted(set(allowed) | set(table)):
            if folder not in table:
                self.fault(design, 1, f"the layer table has no row for {folder}/ (tools/check_layers.sh has one)")
            elif folder not in allowed:
                self.fault(design, table_line[folder], f"{folder}/ is in the layer table but not in tools/check_layers.sh")
            elif table[folder] != allowed[folder]:
                self.fault(design, table_line[folder],
                           f"{folder}/ may include {', '.join(sorted(table[folder])) or 'nothing'} here, but "
                           f"{', '.join(sorted(allowed[folder])) or 'nothing'} in tools/check_layers.sh")

    # --- all of it ----------------------------------------------------------

    def run(self):
        readme = os.path.join(self.root, "README.md")
        if not os.path.exists(readme):
            self.fault(readme, 1, "no README.md")
            return
        if self.troupe and not os.access(self.troupe, os.X_OK):
            self.fault(readme, 1, f"--troupe {self.troupe}: not an executable")
            return
        self.check_readme(readme)
        linked = self.check_links(readme)
        self.check_blocks(readme)
        pages = self.pages()
        for page in pages:
            if page not in linked:
                self.fault(readme, 1, f"no link to {os.path.relpath(page, self.root)} (every page is linked from the README)")
            self.check_links(page)
            self.check_blocks(page)
        self.check_layers()
        # The tables of figures: generated from the benchmarks' JSON (tools/bench_docs.py).
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_docs
        figures = bench_docs.Docs(self.root)
        figures.run(write=False)
        self.faults += figures.faults
        return len(pages)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--troupe", help="the troupe binary: flags from `troupe VERB --help` (default: cli/'s sources)")
    parser.add_argument("--max-readme-lines", type=int, default=220)
    args = parser.parse_args()
    checker = Checker(args.root, args.troupe, args.max_readme_lines)
    pages = checker.run()
    for fault in checker.faults:
        print(fault)
    if checker.faults:
        print(f"check_docs: {len(checker.faults)} fault(s)")
        return 1
    print(f"check_docs: the README and {pages} pages hold together ({checker.commands_checked} shell commands checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
