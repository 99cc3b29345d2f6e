#include "engine/cuda/nccl_collectives.h"

#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/replicator/mpi.h"

namespace troupe::cuda {
namespace {

using replicator::DescribeCollective;
using replicator::ReduceOp;

ncclComm_t AsComm(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

#define RETURN_IF_NCCL_ERROR(what, call)                     \
  do {                                                       \
    const ncclResult_t troupe_nccl_result_ = (call);         \
    if (troupe_nccl_result_ != ncclSuccess) return NcclError(what, troupe_nccl_result_); \
  } while (false)

// Reads the id file rank 0 writes, waiting for it to appear.
absl::Status ReadIdFile(const std::string& path, ncclUniqueId* id, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(reinterpret_cast<char*>(id), sizeof(*id)) && in.gcount() == sizeof(*id)) {
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL id file ", path, " did not appear within ", timeout.count(), " ms (is rank 0 running?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Writes the id to a temporary file and renames it, so readers never see half.
absl::Status WriteIdFile(const std::string& path, const ncclUniqueId& id) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(reinterpret_cast<const char*>(&id), sizeof(id))) {
      return absl::UnavailableError(absl::StrCat("cannot write NCCL id file ", tmp));
    }
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", error.message()));
  return absl::OkStatus();
}

absl::Status CheckDevice(int device) {
  std::string why;
  const int count = DeviceCount(&why);
  if (count == 0) return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " device(s))"));
  }
  return absl::OkStatus();
}

}  // namespace

NcclCollectives::NcclCollectives(int rank, int size, int device, std::chrono::milliseconds timeout,
                                 bool check_descriptors)
    : rank_(rank), size_(size), device_(device), timeout_(timeout), check_descriptors_(check_descriptors) {}

NcclCollectives::~NcclCollectives() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(AsStream(stream_));
  if (comm_ != nullptr) {
    if (failure_.ok()) {
      ncclCommDestroy(AsComm(comm_));
    } else {
      ncclCommAbort(AsComm(comm_));
    }
  }
  for (Staging& s : staging_) cudaFree(s.data);
  cudaFree(descriptors_);
  if (stream_ != nullptr) cudaStreamDestroy(AsStream(stream_));
}

absl::Status NcclCollectives::Init(const void* unique_id) {
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice(", device_, "): ", cudaGetErrorString(e)));
  }
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  CUDA_CHECK(cudaMalloc(&descriptors_, sizeof(int64_t) * 4 * (size_ + 1)));
  if (unique_id != nullptr) {
    ncclComm_t comm = nullptr;
    RETURN_IF_NCCL_ERROR("ncclCommInitRank",
                         ncclCommInitRank(&comm, size_, *static_cast<const ncclUniqueId*>(unique_id), rank_));
    comm_ = comm;
  }
  return absl::OkStatus();
}

int NcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

std::string NcclVersionString() {
  const int v = NcclVersion();
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(const NcclOptions& options) {
  if (options.num_replicas < 1 || options.rank < 0 || options.rank >= options.num_replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", options.rank, " is not in [0, ", options.num_replicas, ")"));
  }
  if (options.id_file.empty()) return absl::InvalidArgumentError("NcclOptions.id_file is empty");
  if (absl::Status s = CheckDevice(options.device); !s.ok()) return s;
  // Rank 0 makes the id and publishes it; the others wait for the file.
  ncclUniqueId id;
  if (options.rank == 0) {
    RETURN_IF_NCCL_ERROR("ncclGetUniqueId", ncclGetUniqueId(&id));
    if (absl::Status s = WriteIdFile(options.id_file, id); !s.ok()) return s;
  } else if (absl::Status s = ReadIdFile(options.id_file, &id, options.timeout); !s.ok()) {
    return s;
  }
  std::unique_ptr<NcclCollectives> c(new NcclCollectives(options.rank, options.num_replicas, options.device,
                                                         options.timeout, options.check_descriptors));
  if (absl::Status s = c->Init(&id); !s.ok()) return s;
  return c;
}

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::CreateWithMpi(std::chrono::milliseconds timeout) {
  // MPI is left initialised for the process's lifetime (it cannot be
  // re-initialised); this node's local rank picks the GPU.
  ASSIGN_OR_RETURN(const replicator::MpiWorld world, replicator::JoinMpiWorld());
  std::string why;
  const int devices = DeviceCount(&why);
  if (devices == 0) return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  ncclUniqueId id;
  if (world.rank == 0) RETURN_IF_NCCL_ERROR("ncclGetUniqueId", ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  std::unique_ptr<NcclCollectives> c(
      new NcclCollectives(world.rank, world.size, world.local_rank % devices, timeout, true));
  if (absl::Status s = c->Init(&id); !s.ok()) return s;
  return c;
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCollectives>>> NcclCollectives::CreateGroup(
    const std::vector<int>& devices, std::chrono::milliseconds timeout) {
  for (int d : devices) {
    if (absl::Status s = CheckDevice(d); !s.ok()) return s;
  }
  const int size = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(size);
  RETURN_IF_NCCL_ERROR("ncclCommInitAll", ncclCommInitAll(comms.data(), size, devices.data()));
  std::vector<std::unique_ptr<NcclCollectives>> group;
  for (int r = 0; r < size; ++r) {
    group.emplace_back(new NcclCollectives(r, size, devices[r], timeout, true));
    if (absl::Status s = group.back()->Init(nullptr); !s.ok()) return s;
    group.back()->comm_ = comms[r];
  }
  return group;
}

float* NcclCollectives::DevicePointer(const float* data, int64_t count, int slot, bool copy_in) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) == cudaSuccess &&
      (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged)) {
    return const_cast<float*>(data);
  }
  cudaGetLastError();
  // Host memory: stage through a device buffer (grown while nothing is pending on it).
  if (static_cast<int>(staging_.size()) <= slot) staging_.resize(slot + 1);
  Staging& s = staging_[slot];
  if (s.capacity < count) {
    CUDA_CHECK(cudaStreamSynchronize(AsStream(stream_)));
    CUDA_CHECK(cudaFree(s.data));
    CUDA_CHECK(cudaMalloc(&s.data, sizeof(float) * std::max<int64_t>(count, 1)));
    s.capacity = count;
  }
  if (copy_in) {
    CUDA_CHECK(cudaMemcpyAsync(s.data, data, sizeof(float) * count, cudaMemcpyHostToDevice, AsStream(stream_)));
  }
  return s.data;
}

absl::Status NcclCollectives::WaitStream(int kind, int64_t count) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    const cudaError_t e = cudaStreamQuery(AsStream(stream_));
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      failure_ = absl::InternalError(absl::StrCat("collective #", seq_, " (", DescribeCollective(kind, count),
                                                  "): ", cudaGetErrorString(e)));
      return failure_;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(AsComm(comm_), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      failure_ = NcclError(absl::StrCat("collective #", seq_, " (", DescribeCollective(kind, count), ")").c_str(),
                           async);
      ncclCommAbort(AsComm(comm_));
      comm_ = nullptr;
      return failure_;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      failure_ = absl::DeadlineExceededError(absl::StrCat("collective #", seq_, " (", DescribeCollective(kind, count),
                                                          ") did not finish within ", timeout_.count(),
                                                          " ms: a replica is missing or stalled"));
      ncclCommAbort(AsComm(comm_));
      comm_ = nullptr;
      return failure_;
    }
    std::this_thread::yield();
  }
}

absl::Status NcclCollectives::CheckDescriptors(int kind, int64_t count, int root) {
  if (!check_descriptors_ || size_ == 1) return absl::OkStatus();
  // descriptors_[0..3] is this replica's; [4..] receives everyone's.
  const int64_t mine[4] = {seq_, kind, count, root};
  int64_t* send = descriptors_;
  int64_t* all = descriptors_ + 4;
  CUDA_CHECK(cudaMemcpyAsync(send, mine, sizeof(mine), cudaMemcpyHostToDevice, AsStream(stream_)));
  RETURN_IF_NCCL_ERROR("ncclAllGather (descriptors)", ncclAllGather(send, all, 4, ncclInt64, AsComm(comm_),
                                                                    AsStream(stream_)));
  std::vector<int64_t> host(4 * size_);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), all, sizeof(int64_t) * 4 * size_, cudaMemcpyDeviceToHost,
                             AsStream(stream_)));
  if (absl::Status s = WaitStream(kind, count); !s.ok()) return s;
  for (int r = 0; r < size_; ++r) {
    const int64_t* d = host.data() + 4 * r;
    if (d[0] != seq_ || d[1] != kind || d[2] != count || d[3] != root) {
      failure_ = absl::FailedPreconditionError(absl::StrCat(
          "collective #", seq_, ": replica ", r, " called ", DescribeCollective(static_cast<int>(d[1]), d[2]),
          " (its #", d[0], "), replica ", rank_, " ", DescribeCollective(kind, count)));
      return failure_;
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::StartAllReduce(std::span<float> data, ReduceOp op) {
  if (!failure_.ok()) return failure_;
  CUDA_CHECK(cudaSetDevice(device_));
  ++seq_;
  const int64_t count = static_cast<int64_t>(data.size());
  if (absl::Status s = CheckDescriptors(replicator::kAllReduce, count, -1); !s.ok()) return s;
  float* device = DevicePointer(data.data(), count, static_cast<int>(pending_.size()), /*copy_in=*/true);
  RETURN_IF_NCCL_ERROR("ncclAllReduce", ncclAllReduce(device, device, count, ncclFloat32,
                                                      op == ReduceOp::kMean ? ncclAvg : ncclSum, AsComm(comm_),
                                                      AsStream(stream_)));
  pending_.push_back({device == data.data() ? nullptr : data.data(), device, count});
  return absl::OkStatus();
}

absl::Status NcclCollectives::WaitAll() {
  if (!failure_.ok()) return failure_;
  // Staged results go back to the host on the same stream, then one wait.
  for (const Pending& p : pending_) {
    if (p.host != nullptr) {
      CUDA_CHECK(cudaMemcpyAsync(p.host, p.device, sizeof(float) * p.count, cudaMemcpyDeviceToHost,
                                 AsStream(stream_)));
    }
  }
  const int64_t total = pending_.empty() ? 0 : pending_.back().count;
  pending_.clear();
  return WaitStream(replicator::kAllReduce, total);
}

absl::Status NcclCollectives::AllReduce(std::span<float> data, ReduceOp op) {
  if (absl::Status s = StartAllReduce(data, op); !s.ok()) return s;
  return WaitAll();
}

absl::Status NcclCollectives::AllGather(std::span<const float> in, std::span<float> out) {
  if (!failure_.ok()) return failure_;
  const int64_t count = static_cast<int64_t>(in.size());
  if (static_cast<int64_t>(out.size()) != count * size_) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: out holds ", out.size(), " floats, expected ",
                                                   count * size_, " (", size_, " x ", count, ")"));
  }
  CUDA_CHECK(cudaSetDevice(device_));
  ++seq_;
  if (absl::Status s = CheckDescriptors(replicator::kAllGather, count, -1); !s.ok()) return s;
  const int slot = static_cast<int>(pending_.size());
  float* send = DevicePointer(in.data(), count, slot, /*copy_in=*/true);
  float* recv = DevicePointer(out.data(), count * size_, slot + 1, /*copy_in=*/false);
  RETURN_IF_NCCL_ERROR("ncclAllGather",
                       ncclAllGather(send, recv, count, ncclFloat32, AsComm(comm_), AsStream(stream_)));
  if (recv != out.data()) {
    CUDA_CHECK(cudaMemcpyAsync(out.data(), recv, sizeof(float) * count * size_, cudaMemcpyDeviceToHost,
                               AsStream(stream_)));
  }
  return WaitStream(replicator::kAllGather, count);
}

absl::Status NcclCollectives::ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) {
  if (!failure_.ok()) return failure_;
  const int64_t count = static_cast<int64_t>(out.size());
  if (static_cast<int64_t>(in.size()) != count * size_) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceScatter: in holds ", in.size(), " floats, expected ",
                                                   count * size_, " (", size_, " x ", count, ")"));
  }
  CUDA_CHECK(cudaSetDevice(device_));
  ++seq_;
  if (absl::Status s = CheckDescriptors(replicator::kReduceScatter, count, -1); !s.ok()) return s;
  // Device memory in place is NCCL's own in-place form (out = in + rank x
  // count); host memory goes through two staging buffers.
  const int slot = static_cast<int>(pending_.size());
  float* send = DevicePointer(in.data(), count * size_, slot, /*copy_in=*/true);
  float* recv = DevicePointer(out.data(), count, slot + 1, /*copy_in=*/false);
  RETURN_IF_NCCL_ERROR("ncclReduceScatter",
                       ncclReduceScatter(send, recv, count, ncclFloat32, op == ReduceOp::kMean ? ncclAvg : ncclSum,
                                         AsComm(comm_), AsStream(stream_)));
  if (recv != out.data()) {
    CUDA_CHECK(cudaMemcpyAsync(out.data(), recv, sizeof(float) * count, cudaMemcpyDeviceToHost, AsStream(stream_)));
  }
  return WaitStream(replicator::kReduceScatter, count);
}

absl::Status NcclCollectives::Broadcast(std::span<float> data, int root) {
  if (!failure_.ok()) return failure_;
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("Broadcast root ", root, " is not in [0, ", size_, ")"));
  }
  CUDA_CHECK(cudaSetDevice(device_));
  ++seq_;
  const int64_t count = static_cast<int64_t>(data.size());
  if (absl::Status s = CheckDescriptors(replicator::kBroadcast, count, root); !s.ok()) return s;
  float* device = DevicePointer(data.data(), count, static_cast<int>(pending_.size()), /*copy_in=*/rank_ == root);
  RETURN_IF_NCCL_ERROR("ncclBroadcast",
                       ncclBroadcast(device, device, count, ncclFloat32, root, AsComm(comm_), AsStream(stream_)));
  if (device != data.data()) {
    CUDA_CHECK(cudaMemcpyAsync(data.data(), device, sizeof(float) * count, cudaMemcpyDeviceToHost,
                               AsStream(stream_)));
  }
  return WaitStream(replicator::kBroadcast, count);
}

void NcclCollectives::Fail(const absl::Status& status) {
  if (!failure_.ok()) return;
  failure_ = absl::AbortedError(absl::StrCat("replica ", rank_, " failed: ", status.message()));
  if (comm_ != nullptr) {
    ncclCommAbort(AsComm(comm_));
    comm_ = nullptr;
  }
}

}  // namespace troupe::cuda
