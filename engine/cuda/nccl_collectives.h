// The NCCL backend of the Replicator's Collectives: one replica per GPU, the
// group formed from NCCL's unique id, which rank 0 makes and hands to the
// others over MPI (`mpirun -np K`, CreateWithMpi), through a file every
// process can read (Create with id_file), or inside one process for a
// multi-GPU test (CreateGroup, one Collectives per device, each then driven
// by its own thread).
//
// Data may be device or managed memory (used in place) or plain host memory
// (the ParameterSet's buffers today: staged through a device buffer per
// pending all-reduce, copied in and out on the collectives' stream).
// StartAllReduce only enqueues, so the Replicator's gradient buckets reduce
// while backward goes on; WaitAll waits for all of them. kMean is ncclAvg.
//
// Errors follow interface.h: when check_descriptors is on, every collective
// first all-gathers (sequence, kind, count) so a mismatch is named
// (FailedPrecondition); a collective that does not finish within the timeout
// aborts the communicator and returns DeadlineExceeded naming it; NCCL's
// asynchronous errors become Internal. Unlike MPI and in-process groups, a
// replica's Fail() cannot tell the others (NCCL has no side channel): it
// aborts its communicator and they see DeadlineExceeded at their timeout.
//
// Not thread-safe: the replica's one thread uses it.
#ifndef TROUPE_ENGINE_CUDA_NCCL_COLLECTIVES_H_
#define TROUPE_ENGINE_CUDA_NCCL_COLLECTIVES_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/replicator/interface.h"

namespace troupe::cuda {

// The NCCL library this process runs with, as ncclGetVersion gives it
// (2.28.9 is 22809), and as "2.28.9".
int NcclVersion();
std::string NcclVersionString();
// From NCCL 2.30 on, NCCL_MULTI_RANK_GPU_ENABLE=1 lets several ranks share
// one GPU (experimental); before, NCCL refuses that ("Duplicate GPU").
inline constexpr int kNcclMultiRankGpuVersion = 23000;

struct NcclOptions {
  int rank = 0;
  int num_replicas = 1;
  int device = 0;  // this process's GPU
  // Where rank 0 writes the unique id and the others read it (Create only).
  std::string id_file;
  std::chrono::milliseconds timeout{60000};  // per collective, and for the id file
  bool check_descriptors = true;
};

class NcclCollectives final : public replicator::Collectives {
 public:
  // FailedPrecondition "no CUDA device: ..." without a GPU; InvalidArgument
  // for a bad rank/size/device or an empty id_file; DeadlineExceeded when the
  // id file does not appear in time; Internal for an NCCL failure.
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> Create(const NcclOptions& options);
  // Rank and size from MPI_COMM_WORLD (initialising MPI if nobody has), the
  // id broadcast from rank 0, device = local rank modulo the visible GPUs.
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> CreateWithMpi(std::chrono::milliseconds timeout);
  // One communicator per device in `devices` (distinct GPUs: NCCL before
  // 2.30 refuses two ranks on one GPU), for a group of threads in this
  // process.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCollectives>>> CreateGroup(
      const std::vector<int>& devices, std::chrono::milliseconds timeout);
  ~NcclCollectives() override;

  int replica_id() const override { return rank_; }
  int num_replicas() const override { return size_; }
  int local_rank() const override { return device_; }  // its GPU
  bool takes_device_memory() const override { return true; }
  absl::Status AllReduce(std::span<float> data, replicator::ReduceOp op) override;
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override;
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out, replicator::ReduceOp op) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status StartAllReduce(std::span<float> data, replicator::ReduceOp op) override;
  absl::Status WaitAll() override;
  void Fail(const absl::Status& status) override;

 private:
  NcclCollectives(int rank, int size, int device, std::chrono::milliseconds timeout, bool check_descriptors);
  // Makes the stream and scratch, then joins the communicator.
  absl::Status Init(const void* unique_id);
  // All-gathers (seq, kind, count) and names the first replica that differs.
  absl::Status CheckDescriptors(int kind, int64_t count, int root);
  // Waits for the stream until the deadline; aborts the communicator on timeout.
  absl::Status WaitStream(int kind, int64_t count);
  // A device pointer for `data`: itself when the GPU can address it, else
  // staging buffer `slot` (filled from the host when `copy_in`).
  float* DevicePointer(const float* data, int64_t count, int slot, bool copy_in);

  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;
  const bool check_descriptors_;
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  int64_t seq_ = 0;
  absl::Status failure_;
  struct Staging {
    float* data = nullptr;
    int64_t capacity = 0;
  };
  std::vector<Staging> staging_;
  struct Pending {
    float* host = nullptr;  // copy back here when staged
    float* device = nullptr;
    int64_t count = 0;
  };
  std::vector<Pending> pending_;
  int64_t* descriptors_ = nullptr;  // device [size_ * 4]
};

}  // namespace troupe::cuda

#endif  // TROUPE_ENGINE_CUDA_NCCL_COLLECTIVES_H_
