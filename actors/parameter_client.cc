#include "actors/parameter_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"

namespace troupe::actors {

ParameterClient::ParameterClient(const std::string& address)
    : address_(address), thread_([this](std::stop_token stop) { Loop(stop); }) {}

ParameterClient::~ParameterClient() {
  thread_.request_stop();
  {
    std::lock_guard lock(mutex_);
    if (context_) context_->TryCancel();
  }
  arrived_.notify_all();
}

void ParameterClient::Loop(std::stop_token stop) {
  // A pixel policy's parameters (~12 MB for the DrQ encoder + 1024x1024
  // actor) exceed gRPC's default 4 MB receive limit: lift it.
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), channel_args);
  auto stub = proto::Parameters::NewStub(channel);
  std::chrono::milliseconds backoff(100);
  bool first_attempt = true;
  while (!stop.stop_requested()) {
    if (!first_attempt) ++reconnects_;
    first_attempt = false;
    // One Get stream, from the version we hold.
    auto context = std::make_shared<grpc::ClientContext>();
    proto::GetParametersRequest request;
    {
      std::lock_guard lock(mutex_);
      if (stop.stop_requested()) return;
      context_ = context;
      request.set_have_version(latest_ ? latest_->version() : 0);
    }
    auto reader = stub->Get(context.get(), request);
    auto update = std::make_shared<proto::ParametersUpdate>();
    while (reader->Read(update.get())) {
      {
        std::lock_guard lock(mutex_);
        latest_ = update;
      }
      arrived_.notify_all();
      update = std::make_shared<proto::ParametersUpdate>();
      backoff = std::chrono::milliseconds(100);
    }
    reader->Finish();
    {
      std::lock_guard lock(mutex_);
      context_.reset();
    }
    // The learner went away (or is not up yet): wait, then reconnect.
    std::mutex sleep_mutex;
    std::unique_lock sleep_lock(sleep_mutex);
    std::condition_variable_any sleeper;
    sleeper.wait_for(sleep_lock, stop, backoff, [] { return false; });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

bool ParameterClient::TakeNewer(int64_t* version, std::vector<float>* parameters) {
  std::shared_ptr<proto::ParametersUpdate> latest;
  {
    std::lock_guard lock(mutex_);
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
  std::unique_lock lock(mutex_);
  if (arrived_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return latest_ != nullptr; })) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no parameters from the learner at ", address_, " within ", timeout_ms, " ms"));
}

}  // namespace troupe::actors
