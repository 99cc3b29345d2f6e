#include "actors/parameter_client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"

namespace troupe::actors {

ParameterClient::ParameterClient(const std::string& address, const GrpcCredentials& credentials)
    : address_(address), credentials_(credentials), thread_([this](std::stop_token stop) { Loop(stop); }) {}

ParameterClient::~ParameterClient() {
  thread_.request_stop();
  absl::MutexLock lock(&mutex_);
  stopping_ = true;
  if (context_) context_->TryCancel();
}

void ParameterClient::Loop(std::stop_token stop) {
  // A pixel policy's parameters (~12 MB for the DrQ encoder + 1024x1024
  // actor) exceed gRPC's default 4 MB receive limit: lift it.
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  auto channel = NewSecureChannel(credentials_, address_, channel_args);
  if (!channel.ok()) {
    absl::MutexLock lock(&mutex_);
    last_error_ = channel.status();
    hopeless_ = true;
    return;
  }
  auto stub = proto::Parameters::NewStub(*channel);
  std::chrono::milliseconds backoff(100);
  bool first_attempt = true;
  std::optional<std::chrono::steady_clock::time_point> lost_since;  // when a working stream was lost
  while (!stop.stop_requested()) {
    if (!first_attempt) {
      ++reconnects_;
      // Wait for the channel (a second at a time, so a stop is seen): the
      // wait drives the connection, which after a failure nothing else
      // would but gRPC's 5 s backup poller, and then the call fails at once.
      for (int i = 0; i < 10 && !stop.stop_requested(); ++i) {
        if ((*channel)->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(1))) break;
      }
    }
    first_attempt = false;
    // One Get stream, from the version we hold.
    auto context = std::make_shared<grpc::ClientContext>();
    proto::GetParametersRequest request;
    {
      absl::MutexLock lock(&mutex_);
      if (stopping_) return;
      context_ = context;
      request.set_have_version(latest_ ? latest_->version() : 0);
    }
    auto reader = stub->Get(context.get(), request);
    auto update = std::make_shared<proto::ParametersUpdate>();
    while (reader->Read(update.get())) {
      if (lost_since) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - *lost_since).count();
        std::fprintf(stderr, "parameters: the stream from %s is back after %.1f s, at version %ld\n",
                     address_.c_str(), seconds, long(update->version()));
        lost_since.reset();
      }
      {
        absl::MutexLock lock(&mutex_);
        latest_ = update;
      }
      update = std::make_shared<proto::ParametersUpdate>();
      backoff = std::chrono::milliseconds(100);
    }
    const absl::Status finished = FromGrpcStatus(reader->Finish());
    // Said once per outage (the learner gone, a partition), after the first version.
    if (!lost_since && latest_version() > 0 && !stop.stop_requested()) {
      lost_since = std::chrono::steady_clock::now();
      std::fprintf(stderr, "parameters: the stream from %s ended (%s); reconnecting with backoff\n", address_.c_str(),
                   finished.ok() ? "by the learner" : std::string(finished.message()).c_str());
    }
    // The learner went away (or is not up yet): wait, then reconnect.
    absl::MutexLock lock(&mutex_);
    context_.reset();
    last_error_ = finished.ok() ? absl::UnavailableError("the stream ended") : finished;
    // A handshake refused (another CA, a wrong name) is refused again on
    // every retry until someone fixes the certificates: WaitForFirst need
    // not wait for it. The stream keeps retrying all the same.
    hopeless_ = latest_ == nullptr && !ExplainTlsFailure(last_error_, credentials_, address_).empty();
    mutex_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(backoff));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

int64_t ParameterClient::latest_version() {
  absl::MutexLock lock(&mutex_);
  return latest_ ? latest_->version() : 0;
}

bool ParameterClient::TakeNewer(int64_t* version, std::vector<float>* parameters) {
  std::shared_ptr<proto::ParametersUpdate> latest;
  {
    absl::MutexLock lock(&mutex_);
    latest = latest_;
  }
  if (!latest || latest->version() <= *version || latest->parameters_size() != 1) return false;
  const std::string& data = latest->parameters(0).tensor().data();
  parameters->resize(data.size() / sizeof(float));
  std::memcpy(parameters->data(), data.data(), parameters->size() * sizeof(float));
  *version = latest->version();
  return true;
}

absl::Status ParameterClient::WaitForFirst(int timeout_ms) {
  absl::MutexLock lock(&mutex_);
  auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return latest_ != nullptr || hopeless_; };
  if (mutex_.AwaitWithTimeout(absl::Condition(&arrived), absl::Milliseconds(timeout_ms)) && latest_ != nullptr) {
    return absl::OkStatus();
  }
  if (hopeless_) {
    const std::string tls = ExplainTlsFailure(last_error_, credentials_, address_);
    const std::string where = absl::StrCat("no parameters from the learner at ", address_, ": ");
    if (tls.empty()) return absl::Status(last_error_.code(), where + std::string(last_error_.message()));
    return absl::UnauthenticatedError(where + tls);
  }
  const std::string why = last_error_.ok() ? "" : absl::StrCat(" (last attempt: ", last_error_.ToString(), ")");
  return absl::DeadlineExceededError(
      absl::StrCat("no parameters from the learner at ", address_, " within ", timeout_ms, " ms", why));
}

}  // namespace troupe::actors
