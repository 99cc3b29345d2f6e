#include "common/certificates.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/grpc_security.h"
#include "common/status_macros.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// Runs `openssl ARGS...` in `dir` (no shell: hosts never reach one); its
// output goes to a log whose text an error carries.
absl::Status Openssl(const std::string& dir, const std::vector<std::string>& args) {
  const std::string log = fs::absolute(fs::path(dir) / ".openssl.log").string();
  // Everything the child needs is made before fork (the caller may have threads).
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  std::string name = "openssl";
  argv.push_back(name.data());
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("troupe certs: fork failed");
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execvp("openssl", argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(log);
  std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(log);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(
        "troupe certs: the openssl command is missing (Debian: apt-get install openssl; tools/install_deps.sh "
        "installs it)");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("troupe certs: `openssl ", absl::StrJoin(args, " "), "` failed: ", output));
  }
  return absl::OkStatus();
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 || inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

bool IsDnsName(const std::string& host) {
  if (host.empty() || host.size() > 253 || host.front() == '-' || host.front() == '.') return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.') return false;
  }
  return true;
}

// A key and a certificate signed by the CA, with `extensions` (an openssl
// extension file's lines).
absl::Status SignedPair(const std::string& dir, const std::string& name, const std::string& subject,
                        const std::string& extensions, int days) {
  const std::string ext_file = name + ".ext";
  if (absl::Status s = WriteFileAtomically((fs::path(dir) / ext_file).string(), extensions); !s.ok()) return s;
  RETURN_IF_ERROR(Openssl(dir, {"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                                "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject}));
  ASSIGN_OR_RETURN(const std::string serial, NewToken());
  RETURN_IF_ERROR(Openssl(dir, {"x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                                "-set_serial", "0x" + serial.substr(0, 30), "-days", std::to_string(days),
                                "-sha256", "-extfile", ext_file, "-out", name + ".pem"}));
  fs::remove(fs::path(dir) / ext_file);
  fs::remove(fs::path(dir) / (name + ".csr"));
  fs::permissions(fs::path(dir) / (name + ".key"), fs::perms::owner_read | fs::perms::owner_write);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCertificates(const std::string& dir, const std::vector<std::string>& hosts, int days) {
  // Every name the server certificate carries: the hosts given, and loopback.
  std::vector<std::string> names = {"DNS:localhost", "IP:127.0.0.1", "IP:::1"};
  for (const std::string& raw : hosts) {
    const std::string host = std::string(absl::StripAsciiWhitespace(raw));
    if (host.empty()) continue;
    std::string name;
    if (IsIpAddress(host)) {
      name = "IP:" + host;
    } else if (IsDnsName(host)) {
      name = "DNS:" + host;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("troupe certs: --hosts '", host,
                                                     "' is neither a DNS name nor an IP address"));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("troupe certs: cannot create '", dir, "': ", error.message()));
  if (fs::exists(fs::path(dir) / "ca.pem")) {
    return absl::AlreadyExistsError(absl::StrCat("troupe certs: '", dir,
                                                 "' already holds a CA (ca.pem); remove the folder or choose another"));
  }
  // The CA, self-signed.
  RETURN_IF_ERROR(Openssl(dir, {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                                "-keyout", "ca.key", "-out", "ca.pem", "-days", std::to_string(days), "-sha256",
                                "-subj", "/CN=troupe CA", "-addext", "basicConstraints=critical,CA:TRUE",
                                "-addext", "keyUsage=critical,keyCertSign,cRLSign"}));
  fs::permissions(fs::path(dir) / "ca.key", fs::perms::owner_read | fs::perms::owner_write);
  // The server's certificate names every host; the client's is for mutual TLS.
  RETURN_IF_ERROR(SignedPair(dir, "server", "/CN=troupe server",
                             absl::StrCat("subjectAltName=", absl::StrJoin(names, ","),
                                          "\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                          "extendedKeyUsage=serverAuth\n"),
                             days));
  RETURN_IF_ERROR(SignedPair(dir, "client", "/CN=troupe client",
                             "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                             "extendedKeyUsage=clientAuth\n",
                             days));
  // The token, readable by its owner only.
  ASSIGN_OR_RETURN(const std::string token, NewToken());
  const std::string token_path = (fs::path(dir) / "token").string();
  const int fd = open(token_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("troupe certs: cannot write '", token_path, "'"));
  const std::string line = token + "\n";
  const bool written = write(fd, line.data(), line.size()) == ssize_t(line.size());
  close(fd);
  if (!written) return absl::InternalError(absl::StrCat("troupe certs: cannot write '", token_path, "'"));
  return absl::OkStatus();
}

}  // namespace troupe
