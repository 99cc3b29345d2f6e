#include "engine/replicator/in_process.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace troupe::replicator {

std::string DescribeCollective(int kind, int64_t count) {
  const char* name = kind == kAllReduce           ? "AllReduce"
                     : kind == kAllGather         ? "AllGather"
                     : kind == kAllReduceOnDevice ? "AllReduceOnDevice"
                     : kind == kReduceScatter     ? "ReduceScatter"
                                                  : "Broadcast";
  return absl::StrCat(name, " of ", count, " floats");
}

class InProcessCollectives final : public Collectives {
 public:
  InProcessCollectives(InProcessGroup* group, int id, bool on_device)
      : group_(group), id_(id), on_device_(on_device) {}
  int replica_id() const override { return id_; }
  int num_replicas() const override { return group_->num_replicas(); }
  // All replicas on one device: device 0.
  int local_rank() const override { return on_device_ ? 0 : id_; }
  bool reduces_on_device() const override { return on_device_; }

  absl::Status AllReduceOnDevice(nn::Backend& backend, float* data, int64_t count, ReduceOp op) override {
    if (!on_device_) return Collectives::AllReduceOnDevice(backend, data, count, op);
    // This replica's kernels that wrote `data` finish before another
    // replica's kernels read it.
    backend.Synchronize();
    InProcessGroup::Slot s{0, kAllReduceOnDevice, count, 0, data, data, count, &backend};
    return group_->Run(id_, seq_++, s, op);
  }

  absl::Status AllReduce(std::span<float> data, ReduceOp op) override {
    if (group_->num_replicas() == 1) {
      // One replica: its sum and its mean are its data (no lock, no copy;
      // an agent's per-update metrics take this every update).
      ++seq_;
      return absl::OkStatus();
    }
    InProcessGroup::Slot s{0, kAllReduce, static_cast<int64_t>(data.size()), 0, data.data(), data.data(),
                           static_cast<int64_t>(data.size())};
    return group_->Run(id_, seq_++, s, op);
  }
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override {
    TROUPE_CHECK(out.size() == in.size() * static_cast<size_t>(num_replicas()));
    InProcessGroup::Slot s{0, kAllGather, static_cast<int64_t>(in.size()), 0, in.data(), out.data(),
                           static_cast<int64_t>(out.size())};
    return group_->Run(id_, seq_++, s, ReduceOp::kSum);
  }
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) override {
    TROUPE_CHECK(in.size() == out.size() * static_cast<size_t>(num_replicas()));
    InProcessGroup::Slot s{0, kReduceScatter, static_cast<int64_t>(out.size()), 0, in.data(), out.data(),
                           static_cast<int64_t>(out.size())};
    return group_->Run(id_, seq_++, s, op);
  }
  absl::Status Broadcast(std::span<float> data, int root) override {
    InProcessGroup::Slot s{0, kBroadcast, static_cast<int64_t>(data.size()), root, data.data(), data.data(),
                           static_cast<int64_t>(data.size())};
    return group_->Run(id_, seq_++, s, ReduceOp::kSum);
  }
  // Threads share the cores; there is no background progress to gain.
  absl::Status StartAllReduce(std::span<float> data, ReduceOp op) override { return AllReduce(data, op); }
  absl::Status WaitAll() override { return absl::OkStatus(); }
  void Fail(const absl::Status& status) override { group_->Fail(id_, status); }

 private:
  InProcessGroup* group_;
  const int id_;
  const bool on_device_;
  int64_t seq_ = 0;
};

InProcessGroup::InProcessGroup(int num_replicas, std::chrono::milliseconds timeout)
    : num_replicas_(num_replicas), timeout_(timeout), slots_(num_replicas) {
  TROUPE_CHECK(num_replicas >= 1);
}

std::unique_ptr<Collectives> InProcessGroup::Member(int id, bool on_device) {
  TROUPE_CHECK(id >= 0 && id < num_replicas_);
  return std::make_unique<InProcessCollectives>(this, id, on_device);
}

void InProcessGroup::Fail(int id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = absl::AbortedError(absl::StrCat("replica ", id, " failed: ", status.message()));
}

absl::Status InProcessGroup::Run(int id, int64_t seq, Slot slot, ReduceOp op) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_;
  slot.seq = seq;
  slots_[id] = slot;
  // Wait until every replica has posted this collective (or failed).
  auto all_posted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.seq >= seq; });
  };
  if (!all_posted()) {
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !failure_.ok() || completed_ >= seq || all_posted();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&released), absl::FromChrono(timeout_))) {
      // Name the replicas that have not arrived, and fail the group.
      std::vector<int> missing;
      for (int r = 0; r < num_replicas_; ++r) {
        if (slots_[r].seq < seq) missing.push_back(r);
      }
      failure_ = absl::DeadlineExceededError(absl::StrCat(
          "replica ", absl::StrJoin(missing, ", replica "), " did not reach collective #", seq, " (",
          DescribeCollective(slot.kind, slot.count), ") within ",
          std::chrono::duration<double>(timeout_).count(), " s; replica ", id, " waited"));
      return failure_;
    }
    if (!failure_.ok()) return failure_;
    if (completed_ >= seq) return absl::OkStatus();  // another replica did the work
  }
  // Last to arrive: check every replica called the same thing, then do it.
  const Slot& first = slots_[0];
  for (int r = 1; r < num_replicas_; ++r) {
    const Slot& s = slots_[r];
    if (s.kind != first.kind || s.count != first.count || (s.kind == kBroadcast && s.root != first.root)) {
      failure_ = absl::FailedPreconditionError(absl::StrCat(
          "collective #", seq, ": replica ", r, " called ", DescribeCollective(s.kind, s.count),
          s.kind == kBroadcast ? absl::StrCat(" from root ", s.root) : "", ", replica 0 called ",
          DescribeCollective(first.kind, first.count),
          first.kind == kBroadcast ? absl::StrCat(" from root ", first.root) : ""));
      return failure_;
    }
  }
  const int64_t n = slot.count;
  switch (slot.kind) {
    case kAllReduce: {
      scratch_.assign(n, 0.0f);
      for (const Slot& s : slots_) {
        for (int64_t i = 0; i < n; ++i) scratch_[i] += s.in[i];
      }
      if (op == ReduceOp::kMean) {
        for (float& v : scratch_) v /= static_cast<float>(num_replicas_);
      }
      for (const Slot& s : slots_) std::memcpy(s.out, scratch_.data(), sizeof(float) * n);
      break;
    }
    case kAllGather:
      for (const Slot& dst : slots_) {
        for (int r = 0; r < num_replicas_; ++r) {
          if (dst.out + r * n != slots_[r].in) std::memcpy(dst.out + r * n, slots_[r].in, sizeof(float) * n);
        }
      }
      break;
    case kReduceScatter:
      // Replica d's part summed in replica order, then written: in place, its
      // out is its own in's part d, which no other part reads.
      scratch_.resize(n);
      for (int d = 0; d < num_replicas_; ++d) {
        std::fill(scratch_.begin(), scratch_.end(), 0.0f);
        for (const Slot& s : slots_) {
          for (int64_t i = 0; i < n; ++i) scratch_[i] += s.in[d * n + i];
        }
        if (op == ReduceOp::kMean) {
          for (float& v : scratch_) v /= static_cast<float>(num_replicas_);
        }
        std::memcpy(slots_[d].out, scratch_.data(), sizeof(float) * n);
      }
      break;
    case kBroadcast:
      for (int r = 0; r < num_replicas_; ++r) {
        if (r != slot.root) std::memcpy(slots_[r].out, slots_[slot.root].in, sizeof(float) * n);
      }
      break;
    case kAllReduceOnDevice: {
      // On the shared device, with the last arriving replica's kernels: the
      // sum in replica order into replica 0's buffer (the same rounding
      // whoever arrives last), the mean, then copies to the others; done
      // before any replica goes on.
      nn::Backend& b = *slot.backend;
      float* sum = slots_[0].out;
      for (int r = 1; r < num_replicas_; ++r) b.Axpy(1.0f, slots_[r].in, sum, n);
      if (op == ReduceOp::kMean) b.Scale(1.0f / static_cast<float>(num_replicas_), sum, sum, n);
      for (int r = 1; r < num_replicas_; ++r) b.Copy(sum, slots_[r].out, n);
      b.Synchronize();
      break;
    }
  }
  completed_ = seq;
  return absl::OkStatus();
}

}  // namespace troupe::replicator
