#include "common/grpc_security.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <sys/random.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace troupe {
namespace {

using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

Digest Sha256(absl::string_view text) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

// How to set credentials up, for refusals.
constexpr char kHowTo[] =
    "Make a CA, certificates and a token once with `troupe certs DIR --hosts HOST1,HOST2` (every name and "
    "address clients dial), copy DIR to each machine, and pass `--certs DIR` to every troupe command (or set "
    "security { certs_dir: \"DIR\" } in the config); or, on a trusted private network only, pass --insecure "
    "(security.insecure)";

absl::StatusOr<std::string> ReadSecurityFile(const std::string& path, absl::string_view field) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("security.", field, ": cannot read '", path, "' (", text.status().message(), ")"));
  }
  return text;
}

// OpenSSL's parsers over a PEM in memory.
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}
std::unique_ptr<X509, X509Deleter> ParseCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Deleter>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// A certificate and its key: both parse, and the key is the certificate's.
absl::Status CheckPair(const std::string& cert_pem, const std::string& key_pem, absl::string_view cert_field,
                       absl::string_view key_field) {
  if (cert_pem.empty() != key_pem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("security.", cert_pem.empty() ? cert_field : key_field,
                                                   " is missing: security.", cert_pem.empty() ? key_field : cert_field,
                                                   " needs it (a certificate and its private key go together)"));
  }
  if (cert_pem.empty()) return absl::OkStatus();
  auto cert = ParseCertificate(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("security.", cert_field, ": not a PEM certificate"));
  }
  auto bio = MemoryBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.", key_field, ": not a PEM private key (or one protected by a passphrase)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("security.", key_field, " is not the private key of security.", cert_field));
  }
  return absl::OkStatus();
}

absl::Status CheckToken(absl::string_view token, absl::string_view source) {
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("the token from ", source, " has ", token.size(),
                                                   " characters; it needs at least ", kMinTokenLength,
                                                   " (`troupe certs` writes one of 64)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the token from ", source, " holds a character other than printable ASCII (no spaces): a call header "
          "cannot carry it"));
    }
  }
  return absl::OkStatus();
}

// The server's token check (file comment, step 2). Runs inline on gRPC's
// thread (IsBlocking false): hashing and comparing take about a microsecond.
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenChecker(absl::string_view token) : expected_(Sha256(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata* consumed,
                       OutputMetadata* /*response*/) override {
    const char* why = "no token";
    if (auto it = metadata.find(kTokenMetadataKey); it != metadata.end()) {
      absl::string_view value(it->second.data(), it->second.size());
      if (absl::ConsumePrefix(&value, "Bearer ") && CRYPTO_memcmp(Sha256(value).data(), expected_.data(),
                                                                  expected_.size()) == 0) {
        consumed->insert({std::string(it->first.data(), it->first.size()),
                          std::string(it->second.data(), it->second.size())});
        return grpc::Status::OK;
      }
      why = "a wrong token";
    }
    LogOncePerConnection(metadata, context, why);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("troupe: this server needs a token and the call carried ", why,
                                     ": give the client the server's token ($", kTokenEnvironmentVariable,
                                     ", --token-file, or the token file of --certs DIR)"));
  }

 private:
  // The auth context is the connection's (gRPC gives every call on it the
  // same one), so a property marks a connection already logged.
  void LogOncePerConnection(const InputMetadata& metadata, grpc::AuthContext* context, const char* why) {
    static constexpr char kLogged[] = "troupe_refusal_logged";
    absl::MutexLock lock(&mutex_);
    ++refused_;
    if (!context->FindPropertyValues(kLogged).empty()) return;
    context->AddProperty(kLogged, "1");
    std::string method = "?";
    if (auto it = metadata.find(":path"); it != metadata.end()) method.assign(it->second.data(), it->second.size());
    std::string peer = "no client certificate";
    for (const auto& type : context->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      if (type != GRPC_SSL_TRANSPORT_SECURITY_TYPE) peer = absl::StrCat(std::string(type.data(), type.size()), " connection");
    }
    for (const auto& identity : context->GetPeerIdentity()) {
      if (peer == "no client certificate") peer = absl::StrCat("client certificate ", std::string(identity.data(), identity.size()));
    }
    std::fprintf(stderr,
                 "troupe: refused a call to %s carrying %s (UNAUTHENTICATED; %s; %ld refused calls so far; later "
                 "refusals on this connection are not logged)\n",
                 method.c_str(), why, peer.c_str(), long(refused_));
    std::fflush(stderr);
  }

  const Digest expected_;
  absl::Mutex mutex_;
  int64_t refused_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Adds the token to every call of a channel (file comment, client side).
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kTokenMetadataKey, *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(absl::string_view token) : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel (which owns this factory)
};

void WarnOnce(std::atomic<bool>& warned, const std::string& text) {
  if (warned.exchange(true)) return;
  std::fprintf(stderr, "troupe: WARNING: %s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace

std::string GrpcCredentials::DescribeServer() const {
  std::string tls = server_tls() ? (mutual_tls ? "mutual TLS" : "TLS") : "";
  if (tls.empty() && token.empty()) return insecure ? "no TLS, no token (insecure)" : "no TLS, no token (loopback)";
  if (tls.empty()) return "token, no TLS (loopback)";
  return token.empty() ? tls : absl::StrCat(tls, " + token");
}

std::string GrpcCredentials::DescribeClient() const {
  std::string tls = client_tls() ? (client_cert_pem.empty() ? "TLS" : "TLS with a client certificate") : "";
  if (tls.empty()) return token.empty() ? "no TLS, no token" : "token, no TLS";
  return token.empty() ? tls : absl::StrCat(tls, " + token");
}

absl::StatusOr<GrpcCredentials> LoadGrpcCredentials(const config::SecurityConfig& config) {
  GrpcCredentials c;
  c.mutual_tls = config.mutual_tls();
  c.server_name = config.server_name();
  c.insecure = config.insecure();
  // Each file: the field, else certs_dir's file of that name when present.
  const std::string& dir = config.certs_dir();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("security.certs_dir: '", dir,
                                            "' is not a folder (make one with `troupe certs ", dir,
                                            " --hosts HOST1,HOST2`)"));
  }
  auto path_of = [&](const std::string& field_value, const char* file) -> std::string {
    if (!field_value.empty() || dir.empty()) return field_value;
    const std::string candidate = (std::filesystem::path(dir) / file).string();
    return std::filesystem::exists(candidate) ? candidate : "";
  };
  struct File {
    std::string path;
    const char* field;
    std::string* out;
  };
  const File files[] = {
      {path_of(config.ca_cert(), "ca.pem"), "ca_cert", &c.ca_pem},
      {path_of(config.server_cert(), "server.pem"), "server_cert", &c.server_cert_pem},
      {path_of(config.server_key(), "server.key"), "server_key", &c.server_key_pem},
      {path_of(config.client_cert(), "client.pem"), "client_cert", &c.client_cert_pem},
      {path_of(config.client_key(), "client.key"), "client_key", &c.client_key_pem},
  };
  for (const File& f : files) {
    if (!f.path.empty()) {
      ASSIGN_OR_RETURN(*f.out, ReadSecurityFile(f.path, f.field));
    }
  }
  RETURN_IF_ERROR(CheckPair(c.server_cert_pem, c.server_key_pem, "server_cert", "server_key"));
  RETURN_IF_ERROR(CheckPair(c.client_cert_pem, c.client_key_pem, "client_cert", "client_key"));
  if (!c.ca_pem.empty() && ParseCertificate(c.ca_pem) == nullptr) {
    return absl::InvalidArgumentError("security.ca_cert: not a PEM certificate");
  }
  if (c.mutual_tls && c.ca_pem.empty()) {
    return absl::InvalidArgumentError(
        "security.mutual_tls needs security.ca_cert (the CA that signed the clients' certificates)");
  }
  // The token: the environment first, then the file.
  if (const char* from_env = std::getenv(kTokenEnvironmentVariable); from_env != nullptr && *from_env != '\0') {
    c.token = from_env;
    RETURN_IF_ERROR(CheckToken(c.token, absl::StrCat("$", kTokenEnvironmentVariable)));
  } else if (const std::string token_file = path_of(config.token_file(), "token"); !token_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadSecurityFile(token_file, "token_file"));
    c.token = text.substr(0, text.find('\n'));
    absl::StripAsciiWhitespace(&c.token);
    RETURN_IF_ERROR(CheckToken(c.token, absl::StrCat("security.token_file '", token_file, "'")));
  }
  return c;
}

std::string HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return std::string(address.substr(1, close == absl::string_view::npos ? absl::string_view::npos : close - 1));
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets: a bare IPv6 address, no port.
  if (colon != absl::string_view::npos && address.find(':') == colon) return std::string(address.substr(0, colon));
  return std::string(address);
}

bool IsLoopbackHost(absl::string_view host) {
  const std::string h = absl::AsciiStrToLower(host);
  if (h == "localhost" || h == "ip6-localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::Status CheckServerCredentials(const GrpcCredentials& credentials, const std::string& listen,
                                    absl::string_view field) {
  const bool loopback = IsLoopbackHost(HostOf(listen));
  const bool has_token = !credentials.token.empty();
  if (credentials.mutual_tls && !credentials.server_tls()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security.mutual_tls needs a server certificate (security.server_cert and server_key) to serve ", field,
        " ", listen));
  }
  if (!loopback && !(credentials.server_tls() && has_token)) {
    if (!credentials.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, " ", listen, " is not a loopback address, and ", credentials.server_tls() ? "there is no token" :
          has_token ? "there is no TLS" : "there is neither TLS nor a token",
          ": anyone who can reach the port could insert into replay and read the policy. ", kHowTo));
    }
    if (has_token && !credentials.server_tls()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, " ", listen, ": a token without TLS would travel in clear beyond loopback; add TLS (--certs DIR, "
          "security.server_cert/server_key) or drop the token"));
    }
  }
  return absl::OkStatus();
}

absl::Status AddSecureListeningPort(grpc::ServerBuilder& builder, const GrpcCredentials& credentials,
                                    const std::string& listen, absl::string_view field, int* port) {
  RETURN_IF_ERROR(CheckServerCredentials(credentials, listen, field));
  const bool loopback = IsLoopbackHost(HostOf(listen));
  const bool has_token = !credentials.token.empty();
  if (!loopback && !(credentials.server_tls() && has_token)) {
    static std::atomic<bool> warned{false};
    WarnOnce(warned, absl::StrCat("serving ", field, " ", listen, " with ", credentials.DescribeServer(),
                                  ": anyone who can reach this port can insert into replay, read the policy and "
                                  "follow episodes. Use it on a trusted private network only"));
  }
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  if (credentials.server_tls()) {
    grpc::SslServerCredentialsOptions options(credentials.mutual_tls
                                                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    if (credentials.mutual_tls) options.pem_root_certs = credentials.ca_pem;
    options.pem_key_cert_pairs.push_back({credentials.server_key_pem, credentials.server_cert_pem});
    server_credentials = grpc::SslServerCredentials(options);
  } else if (has_token && loopback) {
    // gRPC's local credentials: no TLS, peers on this machine only, and
    // (unlike insecure credentials) an auth metadata processor.
    server_credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    server_credentials = grpc::InsecureServerCredentials();
  }
  if (has_token) server_credentials->SetAuthMetadataProcessor(std::make_shared<TokenChecker>(credentials.token));
  // Keepalive: a client that vanished (a partition, a pulled cable) is
  // noticed and its streams end; clients' pings are welcome.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, int(absl::ToInt64Milliseconds(kServerKeepaliveTime)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, int(absl::ToInt64Milliseconds(kKeepaliveTimeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             int(absl::ToInt64Milliseconds(kClientKeepaliveTime) / 2));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddListeningPort(listen, server_credentials, port);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewSecureChannel(const GrpcCredentials& credentials,
                                                                const std::string& target,
                                                                grpc::ChannelArguments args) {
  const bool loopback = IsLoopbackHost(HostOf(target));
  const bool has_token = !credentials.token.empty();
  // Keepalive: a connection that stopped answering (a partition) fails its
  // calls UNAVAILABLE within kClientKeepaliveTime + kKeepaliveTimeout
  // instead of waiting on TCP for many minutes; reconnecting backs off to
  // kMaxReconnectBackoff at most.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, int(absl::ToInt64Milliseconds(kClientKeepaliveTime)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, int(absl::ToInt64Milliseconds(kKeepaliveTimeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, int(absl::ToInt64Milliseconds(kMaxReconnectBackoff)));
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  if (credentials.client_tls()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = credentials.ca_pem;
    options.pem_private_key = credentials.client_key_pem;
    options.pem_cert_chain = credentials.client_cert_pem;
    channel_credentials = grpc::SslCredentials(options);
    if (!credentials.server_name.empty()) args.SetSslTargetNameOverride(credentials.server_name);
  } else if (!loopback) {
    if (!credentials.insecure) {
      return absl::FailedPreconditionError(absl::StrCat(
          "connecting to ", target, " (not a loopback address) without TLS: the server could not be told from an "
          "impostor and the calls could be read on the way. ", kHowTo));
    }
    if (has_token) {
      return absl::FailedPreconditionError(absl::StrCat(
          "connecting to ", target, ": a token without TLS would travel in clear beyond loopback; add TLS "
          "(--certs DIR, security.ca_cert) or drop the token"));
    }
    static std::atomic<bool> warned{false};
    WarnOnce(warned, absl::StrCat("connecting to ", target, " without TLS (insecure): use it on a trusted private "
                                  "network only"));
    channel_credentials = grpc::InsecureChannelCredentials();
  } else if (has_token) {
    channel_credentials = grpc::experimental::LocalCredentials(LOCAL_TCP);
  } else {
    channel_credentials = grpc::InsecureChannelCredentials();
  }
  if (!has_token) return grpc::CreateCustomChannel(target, channel_credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(credentials.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, channel_credentials, args,
                                                                 std::move(interceptors));
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  const Digest da = Sha256(a), db = Sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) return absl::InternalError("getrandom failed: no randomness for a token");
    got += size_t(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

std::string ExplainTlsFailure(const absl::Status& status, const GrpcCredentials& credentials,
                              absl::string_view address) {
  if (status.ok()) return "";
  const std::string message = absl::AsciiStrToLower(status.message());
  const bool handshake = absl::StrContains(message, "handshake failed") ||
                         absl::StrContains(message, "certificate_verify_failed") ||
                         absl::StrContains(message, "certificate verify failed") ||
                         absl::StrContains(message, "wrong_version_number") ||
                         absl::StrContains(message, "tlsv1_alert") || absl::StrContains(message, "ssl_error");
  if (!handshake) return "";
  const std::string host = HostOf(address);
  std::string why;
  if (!credentials.client_tls()) {
    why = "this side speaks no TLS and the server does (give it the CA: security.ca_cert or --certs DIR)";
  } else if (absl::StrContains(message, "wrong_version_number")) {
    why = "the server does not speak TLS (start it with a certificate: security.certs_dir or --certs DIR)";
  } else if (absl::StrContains(message, "certificate_verify_failed") ||
             absl::StrContains(message, "certificate verify failed")) {
    why = absl::StrCat("the server's certificate is not signed by this side's CA (security.ca_cert / --certs DIR: "
                       "use the ca.pem of the `troupe certs` folder the server's certificate came from)");
  } else if (absl::StrContains(message, "alert") && credentials.client_cert_pem.empty()) {
    why = "the server asks for a client certificate (mutual TLS) and this side has none (security.client_cert)";
  } else {
    why = absl::StrCat("the server's certificate is not accepted: not signed by this side's CA, or not issued for \"",
                       credentials.server_name.empty() ? host : credentials.server_name,
                       "\" (`troupe certs DIR --hosts ", host, "` makes one that is; security.server_name checks "
                       "another name)");
  }
  return absl::StrCat("cannot authenticate the connection to ", address, " over TLS: ", why, " (gRPC: ",
                      status.message(), ")");
}

}  // namespace troupe
