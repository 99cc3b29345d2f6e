#include "engine/replicator/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace troupe::replicator {
namespace {
constexpr int kDescriptorTag = 7001;
using Clock = std::chrono::steady_clock;

void Scale(std::span<float> data, float factor) {
  float* __restrict v = data.data();
  const size_t n = data.size();
  for (size_t i = 0; i < n; ++i) v[i] *= factor;
}
}  // namespace

struct MpiComm {
  MPI_Comm comm = MPI_COMM_WORLD;
  ~MpiComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_WORLD && comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
};

struct MpiCollectives::Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  std::span<float> data;
  ReduceOp op;
};

absl::StatusOr<MpiWorld> JoinMpiWorld() {
  MpiWorld world;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      return absl::UnavailableError("MPI_Init_thread failed (is this process started by mpirun?)");
    }
    world.initialized_here = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &world.local_rank);
  MPI_Comm_free(&node);
  return world;
}

absl::StatusOr<std::unique_ptr<MpiCollectives>> MpiCollectives::Create(std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(const MpiWorld world, JoinMpiWorld());
  // Errors come back as codes, not aborts, so they can become Status.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiCollectives>(new MpiCollectives(std::make_unique<MpiComm>(), world.rank, world.size,
                                                            world.local_rank, world.initialized_here, timeout));
}

absl::StatusOr<std::unique_ptr<MpiCollectives>> MpiCollectives::CreateSplit(int color, int key,
                                                                             std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return absl::FailedPreconditionError("MpiCollectives::CreateSplit before MPI was initialised");
  ASSIGN_OR_RETURN(const MpiWorld world, JoinMpiWorld());
  auto comm = std::make_unique<MpiComm>();
  if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm->comm) != MPI_SUCCESS) {
    return absl::InternalError(absl::StrCat("MPI_Comm_split(color ", color, ", key ", key, ") failed on rank ",
                                            world.rank));
  }
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm->comm, &rank);
  MPI_Comm_size(comm->comm, &size);
  return std::unique_ptr<MpiCollectives>(
      new MpiCollectives(std::move(comm), rank, size, world.local_rank, /*owns_mpi=*/false, timeout));
}

MpiCollectives::MpiCollectives(std::unique_ptr<MpiComm> comm, int rank, int size, int local_rank, bool owns_mpi,
                               std::chrono::milliseconds timeout)
    : comm_(std::move(comm)),
      rank_(rank),
      size_(size),
      local_rank_(local_rank),
      owns_mpi_(owns_mpi),
      timeout_(timeout) {}

MpiCollectives::~MpiCollectives() {
  for (auto& p : pending_) {
    if (p->request != MPI_REQUEST_NULL) MPI_Request_free(&p->request);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

void MpiCollectives::Fail(const absl::Status& status) {
  // Peers learn of it by timing out on this rank; remember it locally.
  if (failure_.ok()) failure_ = absl::AbortedError(absl::StrCat("replica ", rank_, " failed: ", status.message()));
}

absl::Status MpiCollectives::CheckDescriptors(int kind, int64_t count, int root) {
  if (!failure_.ok()) return failure_;
  const int64_t seq = seq_++;
  if (size_ == 1) return absl::OkStatus();
  std::array<int64_t, 4> mine = {seq, kind, count, root};
  std::vector<std::array<int64_t, 4>> theirs(size_);
  std::vector<MPI_Request> requests;
  std::vector<int> peer_of;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    requests.emplace_back();
    MPI_Irecv(theirs[r].data(), 4, MPI_INT64_T, r, kDescriptorTag, comm_->comm, &requests.back());
    peer_of.push_back(r);
    requests.emplace_back();
    MPI_Isend(mine.data(), 4, MPI_INT64_T, r, kDescriptorTag, comm_->comm, &requests.back());
    peer_of.push_back(-1);
  }
  // Poll until all receives are in or the deadline passes.
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (Clock::now() > deadline) {
      std::vector<int> missing;
      for (size_t k = 0; k < requests.size(); ++k) {
        if (peer_of[k] < 0 || requests[k] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        MPI_Test(&requests[k], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
          missing.push_back(peer_of[k]);
          MPI_Cancel(&requests[k]);
          MPI_Request_free(&requests[k]);
        }
      }
      failure_ = absl::DeadlineExceededError(absl::StrCat(
          "replica ", absl::StrJoin(missing, ", replica "), " did not reach collective #", seq, " (",
          DescribeCollective(kind, count), ") within ", std::chrono::duration<double>(timeout_).count(),
          " s; replica ", rank_, " waited"));
      return failure_;
    }
    std::this_thread::yield();
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto& t = theirs[r];
    if (t[0] != seq || t[1] != kind || t[2] != count || (kind == kBroadcast && t[3] != root)) {
      failure_ = absl::FailedPreconditionError(absl::StrCat(
          "collective #", seq, ": replica ", r, " called ", DescribeCollective(static_cast<int>(t[1]), t[2]),
          " (its #", t[0], "), replica ", rank_, " called ", DescribeCollective(kind, count)));
      return failure_;
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCollectives::Wait(void* request_ptr, int kind, int64_t count) {
  auto* request = static_cast<MPI_Request*>(request_ptr);
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    int done = 0;
    if (MPI_Test(request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      failure_ = absl::InternalError(absl::StrCat("MPI error in ", DescribeCollective(kind, count), " on replica ", rank_));
      return failure_;
    }
    if (done) return absl::OkStatus();
    if (Clock::now() > deadline) {
      failure_ = absl::DeadlineExceededError(absl::StrCat(DescribeCollective(kind, count), " on replica ", rank_,
                                                          " did not complete within ",
                                                          std::chrono::duration<double>(timeout_).count(),
                                                          " s: another replica stalled mid-collective"));
      return failure_;
    }
    std::this_thread::yield();
  }
}

absl::Status MpiCollectives::AllReduce(std::span<float> data, ReduceOp op) {
  // Nonblocking and polled against the timeout, like every collective here:
  // a replica stopped inside the collective (after the descriptor exchange)
  // must be an error, not a hang. OpenMPI's blocking MPI_Allreduce is faster
  // (troupe bench learner measures both) but has no timeout.
  RETURN_IF_ERROR(StartAllReduce(data, op));
  return WaitAll();
}

absl::Status MpiCollectives::StartAllReduce(std::span<float> data, ReduceOp op) {
  RETURN_IF_ERROR(CheckDescriptors(kAllReduce, static_cast<int64_t>(data.size()), 0));
  auto p = std::make_unique<Pending>();
  p->data = data;
  p->op = op;
  if (size_ > 1) {
    MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM, comm_->comm,
                   &p->request);
  }
  pending_.push_back(std::move(p));
  // OpenMPI progresses nonblocking collectives only inside MPI calls: poke
  // the ones in flight so earlier buckets move while backward goes on.
  for (auto& q : pending_) {
    int done = 0;
    if (q->request != MPI_REQUEST_NULL) MPI_Test(&q->request, &done, MPI_STATUS_IGNORE);
  }
  return absl::OkStatus();
}

absl::Status MpiCollectives::WaitAll() {
  for (auto& p : pending_) {
    if (p->request != MPI_REQUEST_NULL) RETURN_IF_ERROR(Wait(&p->request, kAllReduce, p->data.size()));
    if (p->op == ReduceOp::kMean) Scale(p->data, 1.0f / static_cast<float>(size_));
  }
  pending_.clear();
  return absl::OkStatus();
}

absl::Status MpiCollectives::AllGather(std::span<const float> in, std::span<float> out) {
  TROUPE_CHECK(out.size() == in.size() * static_cast<size_t>(size_));
  RETURN_IF_ERROR(CheckDescriptors(kAllGather, static_cast<int64_t>(in.size()), 0));
  MPI_Request request;
  // MPI forbids aliased buffers: in place is MPI_IN_PLACE.
  const bool in_place = in.data() == out.data() + rank_ * in.size();
  MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()), MPI_FLOAT, out.data(),
                 static_cast<int>(in.size()), MPI_FLOAT, comm_->comm, &request);
  return Wait(&request, kAllGather, static_cast<int64_t>(in.size()));
}

absl::Status MpiCollectives::ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) {
  TROUPE_CHECK(in.size() == out.size() * static_cast<size_t>(size_));
  const int64_t count = static_cast<int64_t>(out.size());
  RETURN_IF_ERROR(CheckDescriptors(kReduceScatter, count, 0));
  // In place (out inside in) the result lands in scratch first: MPI's own
  // MPI_IN_PLACE would put it at the start of the buffer, not at this rank's part.
  const bool aliased = out.data() >= in.data() && out.data() < in.data() + in.size();
  float* result = out.data();
  if (aliased) {
    scratch_.resize(out.size());
    result = scratch_.data();
  }
  MPI_Request request;
  MPI_Ireduce_scatter_block(in.data(), result, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_->comm, &request);
  RETURN_IF_ERROR(Wait(&request, kReduceScatter, count));
  if (aliased) std::copy(scratch_.begin(), scratch_.end(), out.begin());
  if (op == ReduceOp::kMean) Scale(out, 1.0f / static_cast<float>(size_));
  return absl::OkStatus();
}

absl::Status MpiCollectives::Broadcast(std::span<float> data, int root) {
  RETURN_IF_ERROR(CheckDescriptors(kBroadcast, static_cast<int64_t>(data.size()), root));
  MPI_Request request;
  MPI_Ibcast(data.data(), static_cast<int>(data.size()), MPI_FLOAT, root, comm_->comm, &request);
  return Wait(&request, kBroadcast, static_cast<int64_t>(data.size()));
}

}  // namespace troupe::replicator
