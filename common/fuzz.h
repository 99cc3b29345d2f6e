// Seeded, reproducible mutation for the fuzz-style tests (a bounded loop in
// ctest, any number of iterations on demand): byte-level mutations of
// serialized data, token-level ones of text configs, and the budget both
// loops share.
//
//   TROUPE_FUZZ_ITERATIONS=N  run exactly N iterations (no time bound)
//   TROUPE_FUZZ_SEED=S        start from seed S (default 1); iteration i of
//                             a run uses seed S + i, so a failure names the
//                             one seed that reproduces it
#ifndef TROUPE_COMMON_FUZZ_H_
#define TROUPE_COMMON_FUZZ_H_

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace troupe::fuzz {

// How many iterations to run and from which seed.
struct Budget {
  int64_t iterations = 0;
  // 0: no time bound (TROUPE_FUZZ_ITERATIONS given).
  double seconds = 0;
  uint64_t seed = 1;

  // From the environment, else `default_iterations` within `default_seconds`.
  static Budget FromEnvironment(int64_t default_iterations, double default_seconds) {
    Budget b{default_iterations, default_seconds, 1};
    if (const char* n = std::getenv("TROUPE_FUZZ_ITERATIONS"); n != nullptr && *n != '\0') {
      b.iterations = std::strtoll(n, nullptr, 10);
      b.seconds = 0;
    }
    if (const char* s = std::getenv("TROUPE_FUZZ_SEED"); s != nullptr && *s != '\0') {
      b.seed = std::strtoull(s, nullptr, 10);
    }
    return b;
  }
};

// Runs body(seed) for each iteration of `budget` until its iterations or its
// time are spent; returns the iterations run.
template <typename Body>
int64_t Loop(const Budget& budget, Body body) {
  const auto start = std::chrono::steady_clock::now();
  int64_t i = 0;
  for (; i < budget.iterations; ++i) {
    if (budget.seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > budget.seconds) {
      break;
    }
    body(budget.seed + static_cast<uint64_t>(i));
  }
  return i;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::mt19937_64& rng() { return rng_; }
  int64_t Uniform(int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high)(rng_); }
  bool OneIn(int n) { return Uniform(0, n - 1) == 0; }

  // A number that breaks sizes and ranges, as text.
  std::string EdgeNumber() {
    static const char* const kEdges[] = {"0",          "-1",          "1",          "2",
                                         "65535",      "65536",       "99999",      "100000",
                                         "2147483647", "-2147483648", "4294967295", "9223372036854775807",
                                         "-9223372036854775808", "18446744073709551615", "1e308",     "-1e308",
                                         "1e-45",      "nan",         "inf",        "-inf",
                                         "0.5",        "1.5",         "3",          "1073741824"};
    return kEdges[Uniform(0, std::size(kEdges) - 1)];
  }

  // An integer edge for binary fields.
  int64_t EdgeInteger() {
    static const int64_t kEdges[] = {0,       -1,      1,          255,       256,        65535,
                                     65536,   1 << 20, 1 << 30,    INT32_MAX, INT32_MIN,  INT64_MAX,
                                     INT64_MIN, 3,     100000000, -100000,   UINT32_MAX};
    return kEdges[Uniform(0, std::size(kEdges) - 1)];
  }

  double EdgeDouble() {
    static const double kEdges[] = {0.0, -0.0, -1.0, 1.0, 1e308, -1e308, 1e-310,
                                    std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                    -std::numeric_limits<double>::infinity(), 0.5, 1e9};
    return kEdges[Uniform(0, std::size(kEdges) - 1)];
  }

  std::string EdgeString() {
    static const char* const kEdges[] = {"", "..", "../x", "/etc/passwd", "a/b", ".hidden", "x\n", "\xff\xfe",
                                         "%s%n", "CON", "table", "state", "pixels", "transitions"};
    if (OneIn(8)) return std::string(static_cast<size_t>(Uniform(200, 5000)), 'A');
    return kEdges[Uniform(0, std::size(kEdges) - 1)];
  }

  // One byte-level mutation of `data` (may empty it).
  void MutateBytes(std::string& data) {
    if (data.empty()) {
      data.push_back(static_cast<char>(Uniform(0, 255)));
      return;
    }
    const size_t at = static_cast<size_t>(Uniform(0, data.size() - 1));
    switch (Uniform(0, 7)) {
      case 0:  // flip a bit
        data[at] = static_cast<char>(data[at] ^ (1 << Uniform(0, 7)));
        break;
      case 1:  // a random byte
        data[at] = static_cast<char>(Uniform(0, 255));
        break;
      case 2:  // an edge byte
        data[at] = static_cast<char>(OneIn(2) ? 0xff : (OneIn(2) ? 0x00 : 0x7f));
        break;
      case 3:  // insert bytes
        data.insert(at, static_cast<size_t>(Uniform(1, 8)), static_cast<char>(Uniform(0, 255)));
        break;
      case 4:  // erase a range
        data.erase(at, static_cast<size_t>(Uniform(1, 16)));
        break;
      case 5:  // truncate
        data.resize(at);
        break;
      case 6: {  // duplicate a range
        const std::string chunk = data.substr(at, static_cast<size_t>(Uniform(1, 32)));
        data.insert(static_cast<size_t>(Uniform(0, data.size())), chunk);
        break;
      }
      default: {  // a varint of all ones (huge lengths, counts, tags)
        const std::string big = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
        data.replace(at, std::min<size_t>(big.size(), data.size() - at), big);
        break;
      }
    }
  }

  // One token-level mutation of a text-format config.
  void MutateText(std::string& text) {
    std::vector<std::pair<size_t, size_t>> tokens;  // [begin, end)
    for (size_t i = 0; i < text.size();) {
      if (std::isspace(static_cast<unsigned char>(text[i]))) {
        ++i;
        continue;
      }
      size_t end = i + 1;
      if (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_' || text[i] == '-' || text[i] == '.') {
        while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_' ||
                                     text[end] == '.' || text[end] == '-' || text[end] == '+')) {
          ++end;
        }
      } else if (text[i] == '"') {
        while (end < text.size() && text[end] != '"' && text[end] != '\n') ++end;
        if (end < text.size() && text[end] == '"') ++end;
      }
      tokens.emplace_back(i, end);
      i = end;
    }
    if (tokens.empty() || OneIn(10)) {
      MutateBytes(text);
      return;
    }
    auto pick = [&] { return tokens[static_cast<size_t>(Uniform(0, tokens.size() - 1))]; };
    switch (Uniform(0, 7)) {
      case 0:
      case 1: {  // a number (or any token) becomes an edge value
        std::vector<std::pair<size_t, size_t>> numbers;
        for (const auto& t : tokens) {
          if (std::isdigit(static_cast<unsigned char>(text[t.first])) || text[t.first] == '-') numbers.push_back(t);
        }
        const auto t = numbers.empty() ? pick() : numbers[static_cast<size_t>(Uniform(0, numbers.size() - 1))];
        text.replace(t.first, t.second - t.first, EdgeNumber());
        break;
      }
      case 2: {  // a string value becomes an edge string
        const auto t = pick();
        text.replace(t.first, t.second - t.first, "\"" + EdgeString() + "\"");
        break;
      }
      case 3: {  // swap two tokens
        auto a = pick(), b = pick();
        if (a.first > b.first) std::swap(a, b);
        if (a.second > b.first) break;
        const std::string ta = text.substr(a.first, a.second - a.first), tb = text.substr(b.first, b.second - b.first);
        text.replace(b.first, b.second - b.first, ta);
        text.replace(a.first, a.second - a.first, tb);
        break;
      }
      case 4: {  // delete a token
        const auto t = pick();
        text.erase(t.first, t.second - t.first);
        break;
      }
      case 5: {  // duplicate a token elsewhere
        const auto t = pick();
        text.insert(pick().first, text.substr(t.first, t.second - t.first) + " ");
        break;
      }
      case 6:  // truncate
        text.resize(pick().first);
        break;
      default:
        MutateBytes(text);
        break;
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace troupe::fuzz

#endif  // TROUPE_COMMON_FUZZ_H_
