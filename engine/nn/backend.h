// The compute backend: every nn op's forward/backward kernel over explicit
// buffers. The autodiff layer (tape.h, ops.h) only calls these; the CPU
// (Eigen) backend in cpu_backend.h is the reference any other backend is
// tested against, op by op.
//
// The kernel set (ggml's supports_op + fallback, tinygrad's small op set):
//  - The CORE, pure virtual, is what a backend must implement: name,
//    num_threads, the memory calls (Allocate, Free, Upload, Download,
//    Synchronize) and twelve generic kernels: Fill (an iota with a step),
//    CopyBlocks, Gemm, Conv2dForward, Conv2dBackward, Unary, UnaryBackward,
//    BinaryBroadcast (over a [outer, mid, inner] view, each operand holding
//    a subset of its axes), Reduce, Gather, Scatter and Convert: 19 pure
//    virtuals (CoreOnlyBackend in testing.h, the tests' backend of the
//    core alone, compiles with exactly these). No algorithm's kernel is
//    among them.
//  - Every other kernel (activations, layer/batch norm, softmax and cross
//    entropy, the optimizers' updates, the row tables' gathers) is a
//    virtual whose default body composes it from the core, written once
//    (composed_kernels.cc). A backend MAY override one with a fused kernel
//    (the CPU and CUDA backends do for most, for speed); the conformance
//    tests check every default body against the CPU's fused one.
//  - An algorithm's kernels are not here: the C51 projection and DrQ's
//    random shift live in agents/, spectral norm in gan/, each composed
//    from the core by the code that owns it. A backend whose memory the
//    host addresses offers to run such a kernel as a host loop instead
//    (HostKernel), so the CPU backends still run them fused.
//  - A composed kernel's temporaries come from the backend's scratch pool
//    (Temporaries below: AllocateScratch memory, grown monotonically and
//    reused), so it allocates nothing after its first call with a given
//    geometry.
//
// Conventions for every kernel:
//  - Buffers are row-major float32; images are NCHW.
//  - Backward kernels ACCUMULATE into gradient outputs (dx += ...), and a null
//    gradient pointer means "not needed" (the input does not require grad).
//  - Kernels never allocate after their first call with a given geometry
//    (scratch is owned by the backend and grows monotonically).
//  - A backend is used by one thread at a time (it may use its own threads).
//
// Device memory (the contract every backend keeps, ggml's backend buffers
// and llm.c's one allocation of all parameters):
//  - Memory from Allocate is the backend's device's. The host moves bytes in
//    and out only with Upload and Download; between kernels it does not read
//    or write it. A pointer into it is an address for this backend's
//    kernels, nothing more. (The CPU backend's memory is ordinary host memory
//    and a slip goes unnoticed there; the strict CPU device,
//    strict_cpu_backend.h, faults on one, so tests catch it without a GPU.)
//  - Kernels may run asynchronously. Download waits for the kernels before
//    it; Synchronize waits for all. Upload may be used before the kernels
//    that read the data without a Synchronize.
//  - Every pointer a kernel takes is the backend's memory: parameters,
//    gradients and optimizer state (ParameterSet, Adam), the tape's values,
//    and inputs the host uploaded (Tape::Input). The strict CPU device
//    aborts on a kernel given host memory.
//  - A backend whose memory the host can address (host_addressable: the
//    CPU) lets code above it skip staging copies (the Replicator's
//    collectives work on it in place); nothing may rely on it otherwise.
//
// Steps (one training update as one unit on the device):
//  - BeginStep() ... EndStep() brackets a step. In between the host issues
//    kernels and uploads its inputs, and reads nothing: what it wants from
//    the step (losses, Q, priorities) it asks for with ReadAtStepEnd, and the
//    bytes land when EndStep returns. A value a kernel reduces (a sum, a
//    norm, a loss, sigma) stays in device memory for the next kernel.
//  - Scratch memory (AllocateScratch: the tape's arena, the composed
//    kernels' temporaries) is dead after the step that wrote it: nothing
//    outside the step may read what the step left there. The PJRT backend compiles a step into one program
//    (pjrt_backend.h), which needs both rules; the strict CPU device aborts
//    on a Download inside a step, so a test proves a step keeps them.
//  - A collective that stages device memory through the host (K replicas
//    whose collectives take host memory) is the one host round trip a step
//    may make, inside a HostStaging scope.
#ifndef TROUPE_ENGINE_NN_BACKEND_H_
#define TROUPE_ENGINE_NN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"

namespace troupe::nn {

// Geometry of a 2-D convolution: input [n, c, h, w] -> output [n, oc, oh, ow],
// weights [oc, c, kh, kw] (PyTorch's layout). For a transposed convolution the
// same struct describes the convolution it is the adjoint of (its "input" is
// the transposed conv's output).
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t oc = 0, kh = 0, kw = 0;
  int64_t stride = 1, pad = 0;
  int64_t oh() const { return (h + 2 * pad - kh) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - kw) / stride + 1; }
  // Multiply-adds of the forward pass times two.
  double ForwardFlops() const { return 2.0 * n * oc * oh() * ow() * c * kh * kw; }
};

enum class Activation { kRelu, kLeakyRelu, kElu, kTanh, kSigmoid, kSoftplus };
// Backend::Unary's functions of x, with its two parameters alpha and beta.
// The first six are the activations (same order as Activation; alpha the
// leaky relu's slope or the elu's scale).
enum class UnaryOp {
  kRelu, kLeakyRelu, kElu, kTanh, kSigmoid, kSoftplus,
  kAffine,      // alpha * x + beta (beta 0: exactly alpha * x)
  kClamp,       // x clamped to [alpha, beta]
  kExp, kLog, kSqrt, kRsqrt, kReciprocal, kSquare, kAbs, kFloor,
  kStep,        // 1 where x > 0, else 0
};
enum class Binary { kAdd, kSub, kMul, kDiv, kMax, kMin };
enum class Reduction { kSum, kMax };
// Element types Backend::Convert converts between.
enum class DType { kU8, kI32, kF32 };
// A [outer, mid, inner] view of a tensor (BinaryBroadcast, Reduce), and the
// axes of it an operand holds: dense over those, in that order (none: a
// scalar on the device; kMidAxis: a per-channel value of [n, c, hw]).
struct View3 {
  int64_t outer = 1, mid = 1, inner = 1;
  int64_t size() const { return outer * mid * inner; }
};
// n contiguous elements as one view.
inline View3 Flat(int64_t n) { return {1, 1, n}; }
enum Axes : int { kScalarAxes = 0, kOuterAxis = 1, kMidAxis = 2, kInnerAxis = 4, kAllAxes = 7 };
// An operand's element strides over a view's outer, mid and inner axes when
// it holds `axes` of them (0 along an axis it is broadcast over).
struct Strides3 {
  int64_t outer, mid, inner;
};
inline Strides3 StridesOf(const View3& v, int axes) {
  const int64_t inner = (axes & kInnerAxis) ? 1 : 0;
  const int64_t mid = (axes & kMidAxis) ? (inner ? v.inner : 1) : 0;
  const int64_t outer = (axes & kOuterAxis) ? ((axes & kMidAxis) ? v.mid : 1) * (inner ? v.inner : 1) : 0;
  return {outer, mid, inner};
}
// An activation applied inside a convolution kernel, per sample, while its
// output is still in cache: a pass over memory less, forward and backward,
// than a separate activation op, and no pre-activation buffer.
enum class FusedActivation { kNone, kRelu };

class Backend {
 public:
  // Aborts when a derived backend left its scratch pool unreleased.
  virtual ~Backend();
  virtual std::string name() const = 0;
  virtual int num_threads() const = 0;
  // True when the host may read and write this backend's memory directly
  // (plain CPU memory): collectives then reduce it in place.
  virtual bool host_addressable() const { return false; }

  // --- Device memory ----------------------------------------------------------
  // `bytes` of this backend's memory, 64-byte aligned and uninitialised (as
  // malloc and cudaMalloc: fill it with a kernel); aborts with file and line
  // when the device has none left, or the memory budget would be exceeded
  // (a training step cannot go on without it). Free with Free (null is
  // ignored).
  void* Allocate(size_t bytes) { return Account(DeviceAllocate(CheckBudget(bytes)), bytes); }
  void Free(void* p);
  // Host -> device and device -> host copies of `bytes`. Download waits for
  // the kernels launched before it.
  virtual void Upload(const void* host, void* device, size_t bytes) = 0;
  virtual void Download(const void* device, void* host, size_t bytes) = 0;
  // Waits for every kernel this backend has launched.
  virtual void Synchronize() = 0;
  float* AllocateFloats(int64_t count) { return static_cast<float*>(Allocate(sizeof(float) * size_t(count))); }
  // Memory whose contents are dead after each step (the tape's arena, the
  // composed kernels' scratch pool): as
  // Allocate, and a backend that compiles steps keeps it out of the step's
  // program (never an argument, never a result).
  void* AllocateScratch(size_t bytes) { return Account(DeviceAllocateScratch(CheckBudget(bytes)), bytes); }
  // A budget of this device's memory in bytes (0: none, the default), as a
  // device of that size would have: an Allocate beyond it aborts, naming
  // the sizes (engine.device_memory_mib). What this backend's allocations
  // hold now (bytes as asked), and the most they held at once since the
  // last ResetPeakMemory.
  void set_memory_budget(size_t bytes);
  size_t memory_budget() const;
  size_t memory_in_use() const;
  size_t peak_memory() const;
  void ResetPeakMemory();

  // --- Steps --------------------------------------------------------------------
  // Brackets one training step (see the header comment). Steps do not nest.
  virtual void BeginStep();
  // Ends the step: its kernels are issued (on PJRT, the step's one program
  // runs) and every ReadAtStepEnd has landed in host memory.
  virtual void EndStep();
  bool in_step() const { return in_step_; }
  // Steps begun so far (BeginStep's, and RunStep's replays, which skip it):
  // what a step's host part prepared belongs to the next one.
  uint64_t steps_begun() const { return steps_begun_; }
  // `bytes` at `device` copied to `host` when the step ends (at once, as
  // Download, outside a step). `host` must stay valid until then.
  void ReadAtStepEnd(const void* device, void* host, size_t bytes);
  // A step the backend may trace once and replay: `device_part` issues the
  // step's kernels and its ReadAtStepEnd reads, and nothing else — its
  // inputs (the batch, per-step values such as an optimizer's bias
  // corrections: Optimizer::Prepare) are already in device memory, uploaded
  // before the call, and each read's host memory stays valid across calls.
  // `signature` names everything the step's program depends on besides
  // device memory's contents (shapes, settings, replicas): a backend that
  // replays (replays_steps()) runs device_part to record the program and,
  // once two recordings under one signature came out the same (program,
  // memory, run-time scalars, reads), executes that program again for each
  // later call without calling device_part. Anything in a recording that a
  // replay could not repeat (an upload inside the step, a host collective's
  // staging, NotReplayable) keeps that signature recording every call.
  // Elsewhere: BeginStep, device_part(), EndStep.
  virtual void RunStep(uint64_t signature, const std::function<void()>& device_part);
  // Whether RunStep may skip device_part (a PJRT backend compiling steps).
  virtual bool replays_steps() const { return false; }
  // Late reads (double-buffered outputs: the host reads step t's results
  // while step t+1 runs). While on, a step's ReadAtStepEnd values do not
  // land in host memory when the step ends: the backend keeps them, and
  // LandReads(s) lands those of every step up to s (steps_begun() after it
  // ran), oldest first. A later step may read into the same host memory:
  // its values land at its own LandReads. Where a step's program runs
  // asynchronously (a PJRT replay), its end does not wait for it; LandReads
  // does. Turning it off changes the steps after; kept reads stay kept.
  void set_late_reads(bool on) { late_reads_ = on; }
  bool late_reads() const { return late_reads_; }
  void LandReads(uint64_t through_step);
  // Steps whose reads are kept and not landed yet.
  size_t steps_unlanded() const;
  // Seconds the device sat idle between a replayed step's end and the next
  // step's start, waiting for the host (backends that can tell: PJRT; 0
  // elsewhere, where the host runs the kernels or waits for each step).
  virtual double device_idle_seconds() const { return 0; }
  // Inside a step: this step takes a value from the host that a replay would
  // not see change (`why` says which), so it records every time.
  virtual void NotReplayable(const char* why) { (void)why; }
  // While one is alive, Download and Upload inside a step are a collective's
  // staging (allowed); see the header comment.
  class HostStaging {
   public:
    explicit HostStaging(Backend& backend) : backend_(backend) { ++backend_.host_staging_; }
    ~HostStaging() { --backend_.host_staging_; }
    HostStaging(const HostStaging&) = delete;
    HostStaging& operator=(const HostStaging&) = delete;

   private:
    Backend& backend_;
  };

  // --- The core: the generic kernels every backend implements ----------------
  // x[i] = value + i * step for i < n (step 0: a fill; else an iota).
  virtual void Fill(float* x, int64_t n, float value, float step = 0.0f) = 0;
  // Strided block copy for concat/slice: for o in [0, outer):
  //   dst[o*dst_stride + dst_offset + i] (+)= src[o*src_stride + src_offset + i], i < len.
  virtual void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                          float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) = 0;
  // C = alpha * op(A) * op(B) + beta * C; op(A) is [m, k], op(B) is [k, n], all
  // row-major and contiguous (A is [k, m] when trans_a). beta 0 ignores C's contents.
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;
  // Convolution. y = act(conv(x, w) + b) (b may be null). y is overwritten.
  virtual void Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                             const float* b, float* y) = 0;
  // Accumulates dx, dw, db (each may be null) from dy, the gradient of the
  // forward's output y (which a fused activation's derivative reads; y may
  // be null without one, x may be null when dw is).
  virtual void Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                              const float* y, const float* dy, float* dx, float* dw, float* db) = 0;
  // y (+)= f(x) elementwise (UnaryOp); y may be x.
  virtual void Unary(UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
                     bool accumulate = false) = 0;
  // dx += f'(x) * dy, reading x and/or y = f(x) (the activations read what
  // their derivative needs: relu, leaky relu, softplus x; tanh, sigmoid y;
  // elu both). Null dx: nothing.
  virtual void UnaryBackward(UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy,
                             float* dx, int64_t n) = 0;
  // y[o, m, i] (+)= a op b over the view `v`, a and b holding the axes
  // `a_axes` and `b_axes` of it (Axes) and broadcast over the others; y is
  // the whole view and may be an operand that holds all axes.
  virtual void BinaryBroadcast(Binary op, const View3& v, const float* a, int a_axes, const float* b, int b_axes,
                               float* y, bool accumulate = false) = 0;
  // y[o, i] (+)= scale * (sum or max over r of x[o, r, i]) for x the view
  // [outer, mid, inner] (reducing its middle axis); an empty sum is 0.
  virtual void Reduce(Reduction op, const View3& v, float scale, const float* x, float* y,
                      bool accumulate = false) = 0;
  // y[o, j, i] = x[o, indices[o, j], i] for x [outer, in, inner], indices
  // [outer, out] (int32, this backend's memory, each in [0, in): out of range
  // aborts on the CPU, is unspecified on a GPU), y [outer, out, inner]. The
  // 32-bit words are copied as bits (uint8 frames travel in float words).
  virtual void Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
                      float* y) = 0;
  // The adjoint: x[o, indices[o, j], i] += values[o, j, i] (`add`; repeated
  // places sum) or = values[o, j, i] (a place named twice gets unspecified bits).
  virtual void Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                       const float* values, float* x, bool add) = 0;
  // y[i] = x[i] * scale converted from `from` to `to` (to kI32: rounded toward
  // zero; to kU8 is not offered): uint8 frames to floats, int32 indices to
  // float arithmetic and back.
  virtual void Convert(DType from, const void* x, DType to, void* y, int64_t n, float scale = 1.0f) = 0;

  // --- Composed kernels (composed_kernels.cc; a backend may fuse any) ---------
  virtual void Copy(const float* x, float* y, int64_t n);
  // y += alpha * x.
  virtual void Axpy(float alpha, const float* x, float* y, int64_t n);
  // y[i] += alpha * scalar[0] (a scalar on the device broadcast over y).
  virtual void AddScalar(float alpha, const float* scalar, float* y, int64_t n);
  // y[r, j] += bias[j] for r < rows, j < cols.
  virtual void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y);
  // dbias[j] += sum_r dy[r, j].
  virtual void RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias);
  // Transposed convolution: x is [n, oc, oh, ow] (the conv's output side),
  // w is [oc, c, kh, kw], y is [n, c, h, w] (overwritten), b has c entries.
  // Composed: the conv's input gradient (Conv2dBackward), and for its
  // backward a conv forward plus the conv's weight gradient.
  virtual void ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                                      float* y);
  virtual void ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy,
                                       float* dx, float* dw, float* db);

  // --- Elementwise ------------------------------------------------------------
  // y = f(x); `alpha` is the negative slope (leaky relu) or scale (elu).
  virtual void ActivationForward(Activation f, float alpha, const float* x, float* y, int64_t n);
  // dx += f'(x) * dy (uses x and/or y = f(x)).
  virtual void ActivationBackward(Activation f, float alpha, const float* x, const float* y, const float* dy,
                                  float* dx, int64_t n);
  // y = a op b; y may alias neither.
  virtual void BinaryForward(Binary op, const float* a, const float* b, float* y, int64_t n);
  // da += d/da, db += d/db (each may be null); add, sub and mul only.
  virtual void BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                              int64_t n);
  // y = alpha * x.
  virtual void Scale(float alpha, const float* x, float* y, int64_t n);

  // --- Reductions -----------------------------------------------------------
  // y[0] = scale * sum of x (double accumulation on the CPU), on the device.
  virtual void Sum(const float* x, int64_t n, float scale, float* y);
  // y[0] = sum of x^2, on the device.
  virtual void SquaredNorm(const float* x, int64_t n, float* y);
  // y[o, i] = sum_r x[o, r, i] over the middle axis of [outer, reduce, inner].
  virtual void SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y);
  // dx[o, r, i] += dy[o, i].
  virtual void SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx);

  // --- Normalisation ----------------------------------------------------------
  // Layer norm over the last axis of [rows, cols]; saves mean and rstd (rows each).
  virtual void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                                const float* beta, float* y, float* mean, float* rstd);
  virtual void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta);
  // Batch norm on [n, c, hw] in two halves so a cross-replica sum can sit
  // between them. Stats (2c + 1 floats): sums[ch] = sum x, sums[c + ch] =
  // sum x^2, sums[2c] = n * hw (the element count, summed with them).
  virtual void BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums);
  // Per channel from the (possibly cross-replica) sums: mean, rstd =
  // 1 / sqrt(var + eps) with the biased variance; and, when running_mean is
  // not null, running += momentum * (batch - running) with the unbiased
  // variance (PyTorch's). Null sums: mean and rstd from the running
  // statistics (evaluation).
  virtual void BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                                float* running_var, float* mean, float* rstd);
  // y = gamma * (x - mean) * rstd + beta with mean/rstd (c each) given.
  virtual void BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                              const float* gamma, const float* beta, float* y);
  // Backward stats (2c + 1): sums[ch] = sum dy, sums[c + ch] = sum dy *
  // xhat, sums[2c] = n * hw.
  virtual void BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                      const float* rstd, const float* dy, float* sums);
  // dx += gamma*rstd*(dy - sum_dy/count - xhat*sum_dy_xhat/count), with the
  // (possibly cross-replica) sums and element count sums[2c].
  virtual void BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                      const float* rstd, const float* gamma, const float* sums, const float* dy,
                                      float* dx);

  // --- Softmax family (over the last axis of [rows, cols]) -------------------
  virtual void SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log);
  virtual void SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log);
  // loss[0] = mean over rows of -log softmax(x)[label]; saves
  // log-probabilities in logp. A label outside [0, cols) aborts (on a GPU,
  // at the step's end).
  virtual void CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                                   float* loss);
  // dx += dloss[0] * (softmax - onehot) / rows (dloss on the device).
  virtual void CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                    const float* dloss, float* dx);

  // --- Images -----------------------------------------------------------------
  // uint8 images with `channels` interleaved ([images, pixels, channels], as
  // cameras and replay keep them) to float planes [images, channels, pixels]
  // times `scale`: observations to network inputs.
  virtual void BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in,
                                  float* out);

  // --- Row tables (the learner's device frame table) --------------------------
  // A table of `rows` rows of `row_words` 32-bit words each, whose bits are
  // copied, never computed on (uint8 frames, four bytes a word: bit for bit
  // whatever they hold). Indices are int32 in this backend's memory, each in
  // [0, rows) (out of range aborts; on a GPU, garbage).
  // out[i, :] = table[indices[i], :] for i < count.
  virtual void GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count,
                          const int32_t* indices, float* out);
  // table[indices[i], :] = values[i, :] for i < count (a row named twice
  // ends up holding unspecified bits).
  virtual void ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                           const float* values);
  // BytesToFloatPlanar of `images` images gathered from such a table: image
  // i is the first pixels * channels bytes of row indices[i]. A fused
  // version gathers inside the conversion (no uint8 copy of the batch).
  virtual void GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                        const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                        float* out);

  // --- Optimizer kernels ------------------------------------------------------
  // Gradient clipping on the device: x *= max_norm / ||x|| when ||x|| >
  // max_norm; norm[0] (device memory, may be null) gets ||x|| before clipping.
  virtual void ClipByNorm(float* x, int64_t n, float max_norm, float* norm);
  // Adam / AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019 for the decoupled
  // weight decay): m, v updated in place; bias corrections c1 = 1 - b1^t,
  // c2 = 1 - b2^t passed in.
  virtual void AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                          float c2, const float* grad, float* param, float* m, float* v);
  // The same with lr, c1 and c2 read from the device (`hyper`: 3 floats), for
  // a step replayed with new values (Adam::Prepare uploads them).
  virtual void AdamUpdateFromDevice(int64_t n, const float* hyper, float beta1, float beta2, float eps,
                                    float weight_decay, const float* grad, float* param, float* m, float* v);
  // SGD with momentum (PyTorch form): buf = mu * buf + g; p -= lr * buf.
  virtual void SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                         float* buf);
  // target = (1 - tau) * target + tau * online.
  virtual void Polyak(int64_t n, float tau, const float* online, float* target);
  // The layer-wise trust ratio of LARS (You et al. 2017) and LAMB (You et
  // al. 2019) from squared norms on the device: ratio[0] = coefficient *
  // |w| / (|u| + weight_decay * |w|) when |w| > 0 and |u| > 0, else 1
  // (|w| = sqrt(w_squared[0]), |u| = sqrt(u_squared[0])).
  virtual void TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                          float* ratio);
  // x *= alpha * scalar[0] (a scalar on the device).
  virtual void ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n);

  // --- Kernels of the layers above ---------------------------------------------
  // An algorithm's kernel (the C51 projection, DrQ's random shift, spectral
  // norm) is written by the code that owns it, composed from the core. A
  // backend whose memory the host addresses may run it as a host loop
  // instead: HostKernel then calls `body` with a parallel-for over the
  // backend's threads, under the same checks as its own kernels (`kernel`
  // names it, `pointers` are the buffers it touches: the strict device
  // checks each is this backend's memory), and returns true. A backend
  // whose memory the host does not address (CUDA, PJRT, the core alone)
  // returns false and the owner composes.
  // The callables are non-owning references (absl::FunctionRef), so a call
  // allocates nothing, like every other kernel.
  using HostRangeFn = absl::FunctionRef<void(int64_t begin, int64_t end)>;
  // loop(n, min_per_range, fn): fn over [0, n) in ranges of at least min_per_range.
  using HostParallelFor = absl::FunctionRef<void(int64_t n, int64_t min_per_range, HostRangeFn fn)>;
  virtual bool HostKernel(const char* /*kernel*/, std::initializer_list<const void*> /*pointers*/,
                          absl::FunctionRef<void(HostParallelFor loop)> /*body*/) {
    return false;
  }

  // Temporaries of a composed kernel: device floats from the backend's
  // scratch pool, valid while the Temporaries lives (nested ones take the
  // blocks after their parent's). The k-th block a kernel asks for is the
  // pool's k-th, grown (never shrunk) when asked for more, so a kernel called
  // again with a geometry it has seen allocates nothing. The pool is
  // AllocateScratch memory: dead after a step, never an argument or result
  // of a compiled step (a block that grows inside a step is freed only
  // outside one).
  class Temporaries {
   public:
    explicit Temporaries(Backend& backend) : backend_(backend), first_(backend.scratch_in_use_) {}
    ~Temporaries() { backend_.scratch_in_use_ = first_; }
    Temporaries(const Temporaries&) = delete;
    Temporaries& operator=(const Temporaries&) = delete;
    float* Floats(int64_t count);
    int32_t* Ints(int64_t count) { return reinterpret_cast<int32_t*>(Floats(count)); }

   private:
    Backend& backend_;
    size_t first_;
  };

  // --- Collectives inside a step ------------------------------------------------
  // True when this backend's steps run as ONE program with the other
  // replicas' (PJRT with K replicas): a step's kernels must then be the same
  // on every replica (no offset may depend on the replica). reduces_in_step()
  // says whether such a step is running now.
  virtual bool runs_replicas_as_one_program() const { return false; }
  // True inside a step that runs as ONE program with the other replicas'
  // (PJRT with K replicas): their collectives are then AllReduceInStep.
  virtual bool reduces_in_step() const { return false; }
  // data (`count` floats of this backend's memory) = its sum (its mean when
  // `mean`) over those replicas: an all_reduce inside the step's program, as
  // TF-Replicator's cross_replica_sum on a TPU. `groups` (replica ids, each
  // replica in one group; null: one group of all) sums within each group
  // instead: one axis of a mesh of replicas. Only where reduces_in_step().
  using ReplicaGroups = std::vector<std::vector<int>>;
  virtual void AllReduceInStep(float* data, int64_t count, bool mean, const ReplicaGroups* groups = nullptr);
  // `in` (K x `part` floats) -> `out` (`part` floats): this replica's part
  // of the sum (mean) over the K replicas, a reduce_scatter inside the
  // step's program. Only where reduces_in_step().
  virtual void ReduceScatterInStep(const float* in, float* out, int64_t part, bool mean);
  // `in` (`part` floats) -> `out` (K x `part`): every replica's `in` in
  // replica order, an all_gather inside the step's program. Only where
  // reduces_in_step().
  virtual void AllGatherInStep(const float* in, float* out, int64_t part);

 protected:
  // Frees the scratch pool; every backend's destructor calls it (the pool is
  // its memory, freed with its Free).
  void ReleaseScratchPool();
  // The device's own allocation (Allocate, AllocateScratch: as those, after
  // the budget was checked) and free.
  virtual void* DeviceAllocate(size_t bytes) = 0;
  virtual void* DeviceAllocateScratch(size_t bytes) { return DeviceAllocate(bytes); }
  virtual void DeviceFree(void* p) = 0;
  struct DeferredRead {
    const void* device;
    void* host;
    size_t bytes;
  };
  // True inside a step outside a HostStaging scope: where a Download is a
  // host round trip that the step contract forbids.
  bool host_reads_forbidden() const { return in_step_ && host_staging_ == 0; }
  // The reads asked for in this step (a backend that overrides EndStep
  // serves them itself); cleared by TakeDeferredReads.
  std::vector<DeferredRead> TakeDeferredReads() { return std::exchange(deferred_reads_, {}); }
  void set_in_step(bool in_step) { in_step_ = in_step; }
  // A step ran without BeginStep (a replay).
  void CountStep() { ++steps_begun_; }
  // With late reads on: `land` puts one of the current step's reads in its
  // host memory, called by LandReads.
  void KeepLateRead(std::function<void()> land);
  // A read of the step that ended: its `bytes` (on the host) copied to its
  // host memory now, or with late reads a copy of them when they land.
  void CopyRead(const DeferredRead& r, const void* bytes);
  // The same, downloading the read's device memory first.
  void DownloadRead(const DeferredRead& r);
  // Forgets the reads not landed (a backend's destructor, before the memory
  // they would read is gone).
  void DropUnlandedReads() { unlanded_.clear(); }

 private:
  bool in_step_ = false;
  uint64_t steps_begun_ = 0;
  int host_staging_ = 0;
  std::vector<DeferredRead> deferred_reads_;
  bool late_reads_ = false;
  // Allocate's accounting: `bytes`, counted in use, if the budget allows
  // them (else aborts); then `p` remembered as holding them.
  size_t CheckBudget(size_t bytes);
  void* Account(void* p, size_t bytes);
  mutable std::mutex memory_mu_;  // replicas sharing a device allocate from their threads
  std::unordered_map<const void*, size_t> allocation_bytes_;
  size_t memory_budget_ = 0, memory_in_use_ = 0, peak_memory_ = 0;
  // A read kept until LandReads: a copy of its bytes for `host`, or (a
  // backend's own, KeepLateRead) a function that lands it.
  struct LateRead {
    uint64_t step;
    void* host;
    std::vector<std::byte> staged;
    std::function<void()> land;
  };
  std::vector<std::byte>& Staged(const DeferredRead& r);  // a new late read's copy, r.bytes long
  std::deque<LateRead> unlanded_;
  std::vector<std::vector<std::byte>> spare_staging_;  // landed reads' copies, for the next
  struct ScratchBlock {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<ScratchBlock> scratch_pool_;
  size_t scratch_in_use_ = 0;            // blocks held by live Temporaries
  std::vector<void*> retired_scratch_;   // outgrown blocks, freed outside a step
};

// A step bracket that ends the step when it goes out of scope (an early
// error return too); End() ends it sooner.
class StepScope {
 public:
  explicit StepScope(Backend& backend) : backend_(&backend) { backend.BeginStep(); }
  ~StepScope() { End(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  void End() {
    if (backend_ != nullptr) backend_->EndStep();
    backend_ = nullptr;
  }

 private:
  Backend* backend_;
};

// `count` floats of a backend's memory, freed with the buffer (move-only):
// parameters, gradients, optimizer state.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Uninitialised, as Backend::Allocate.
  DeviceBuffer(Backend& backend, int64_t count)
      : backend_(&backend), data_(backend.AllocateFloats(count)), size_(count) {}
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      backend_ = other.backend_;
      data_ = other.data_;
      size_ = other.size_;
      other.backend_ = nullptr;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // A device address: for kernels, Upload and Download only.
  float* data() const { return data_; }
  int64_t size() const { return size_; }
  Backend* backend() const { return backend_; }
  bool empty() const { return data_ == nullptr; }

  // Host copies of the whole buffer or of floats [offset, offset + n).
  void Upload(std::span<const float> host, int64_t offset = 0) {
    backend_->Upload(host.data(), data_ + offset, sizeof(float) * host.size());
  }
  void Download(std::span<float> host, int64_t offset = 0) const {
    backend_->Download(data_ + offset, host.data(), sizeof(float) * host.size());
  }
  std::vector<float> Download() const {
    std::vector<float> host(static_cast<size_t>(size_));
    Download(host);
    return host;
  }

 private:
  void Reset() {
    if (data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
  }
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_BACKEND_H_
