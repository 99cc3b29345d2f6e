// StableHLO programs written as MLIR text, the portable input every PJRT
// plugin compiles (TPU, GPU and CPU alike). A Function collects typed SSA
// values and prints one module with a public @main; ops are printed in
// MLIR's generic form ("stablehlo.add"(%0, %1) : (...) -> ...), which every
// StableHLO version parses the same way.
//
//   Function f;
//   Value x = f.Parameter({4}, "f32");
//   f.Return({f.Mul(x, f.Constant(2.0))});
//   std::string text = f.Module();
//
// Shapes are checked as ops are added (a mismatch is a programmer error and
// aborts with the op's name), so a kernel's program is well-typed before a
// plugin sees it.
#ifndef TROUPE_ENGINE_PJRT_STABLEHLO_H_
#define TROUPE_ENGINE_PJRT_STABLEHLO_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::pjrt {

using Dims = std::vector<int64_t>;

// An SSA value: its name (%3), dimensions and element type (f32, bf16, i32,
// i64, ui8, i1).
struct Value {
  std::string id;
  Dims dims;
  std::string type;
  int64_t size() const;
  int rank() const { return static_cast<int>(dims.size()); }
};

// "tensor<2x3xf32>", "tensor<f32>" for a scalar.
std::string TensorType(const Dims& dims, std::string_view type);
std::string TensorType(const Value& v);
// A float as an MLIR literal that reads back to the same float32.
std::string FloatLiteral(double v);

// A 128-bit fingerprint of a program: equal for programs whose text is
// equal and, short of a hash collision, only for them.
struct Fingerprint {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Fingerprint&) const = default;
};
struct FingerprintHash {
  size_t operator()(const Fingerprint& f) const { return static_cast<size_t>(f.lo); }
};

class Function {
 public:
  // A parameter of @main.
  Value Parameter(const Dims& dims, std::string_view type);
  // Lets the program write result `output` into parameter `parameter`'s
  // buffer (tf.aliasing_output: the buffer is donated, so an in-place update
  // costs no copy).
  void AliasParameter(int parameter, int output);
  int num_parameters() const { return static_cast<int>(parameters_.size()); }
  void Return(const std::vector<Value>& results);
  // The program runs as `replicas` replicas (one per device); AllReduce sums
  // across them.
  void set_replicas(int replicas) { replicas_ = replicas; }
  int replicas() const { return replicas_; }
  // The module's text: @main with the parameters, the ops and the results.
  std::string Module() const;
  // The fingerprint of the text Module() would print, kept up as ops are
  // added, so a program met before is found again without printing it.
  Fingerprint fingerprint() const;

  // Any op in generic form with result [dims] of `type`.
  Value Op(std::string_view name, std::vector<Value> args, const Dims& dims, std::string_view type,
           std::string_view attributes = "", std::string_view region = "");

  // --- Constants and shapes ---
  Value Constant(double v, std::string_view type = "f32", const Dims& dims = {});
  Value Iota(const Dims& dims, int axis, std::string_view type = "i32");
  Value Reshape(const Value& x, const Dims& dims);
  // Broadcasts x to `dims`, x's axis i becoming axis map[i].
  Value Broadcast(const Value& x, const Dims& dims, const std::vector<int64_t>& map);
  // x (rank 0 or of `dims` already) to `dims`.
  Value Splat(const Value& x, const Dims& dims);
  Value Transpose(const Value& x, const std::vector<int64_t>& permutation);
  Value Slice(const Value& x, const Dims& start, const Dims& limit);
  // x with `lo`/`hi` elements of `value` (a scalar) around each axis (negative: cropped).
  Value Pad(const Value& x, const Value& value, const Dims& lo, const Dims& hi);
  Value Concatenate(const std::vector<Value>& parts, int axis);
  Value Convert(const Value& x, std::string_view type);
  Value BitcastConvert(const Value& x, const Dims& dims, std::string_view type);
  // Writes `update` into x at constant `offsets`.
  Value UpdateSlice(const Value& x, const Value& update, const Dims& offsets);
  // stablehlo.gather: for each index vector (the last axis of `indices`, i32,
  // its entries x's axes `start_index_map`), the slice of x of `slice_sizes`
  // starting there. The result has the indices' other axes, in order, and
  // the slice's axes not in `collapsed` (each of size 1) at the result axes
  // `offset_dims` (ascending).
  Value Gather(const Value& x, const Value& indices, const Dims& offset_dims, const Dims& collapsed,
               const Dims& start_index_map, const Dims& slice_sizes);
  // The adjoint of Gather: x with each window of `updates` added at the
  // place its index vector names (stablehlo.scatter with an add; repeated
  // places sum). `window_dims`: the axes of `updates` that are window axes;
  // `inserted`: x's axes of size 1 in the window; the index vector's entries
  // are x's axes `index_map`.
  Value ScatterAdd(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                   const Dims& inserted, const Dims& index_map);
  // The same places of x replaced by the windows of `updates` (a place
  // named twice gets one of them).
  Value ScatterReplace(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                       const Dims& inserted, const Dims& index_map);
  Value Reverse(const Value& x, const std::vector<int64_t>& axes);

  // --- Elementwise (a rank-0 operand is broadcast to the other's shape) ---
  Value Add(const Value& a, const Value& b) { return Binary("add", a, b); }
  Value Sub(const Value& a, const Value& b) { return Binary("subtract", a, b); }
  Value Mul(const Value& a, const Value& b) { return Binary("multiply", a, b); }
  Value Div(const Value& a, const Value& b) { return Binary("divide", a, b); }
  Value Max(const Value& a, const Value& b) { return Binary("maximum", a, b); }
  Value Min(const Value& a, const Value& b) { return Binary("minimum", a, b); }
  Value Binary(std::string_view op, const Value& a, const Value& b);
  // exponential, log, tanh, logistic, sqrt, rsqrt, abs, negate, floor, ceil,
  // log_plus_one, exponential_minus_one.
  Value Unary(std::string_view op, const Value& x);
  // "EQ", "NE", "LT", "LE", "GT", "GE": an i1 tensor.
  Value Compare(const Value& a, const Value& b, std::string_view direction);
  Value Select(const Value& predicate, const Value& on_true, const Value& on_false);
  Value Clamp(const Value& lo, const Value& x, const Value& hi);

  // --- Reductions ("add" or "maximum") over `axes` ---
  Value Reduce(const Value& x, const std::vector<int64_t>& axes, std::string_view op = "add");

  // --- Linear algebra ---
  // dot_general: batch axes first in the result, then a's free axes, then b's.
  // `highest`: full float32 precision (no TF32 or bf16 passes on a GPU or TPU).
  Value Dot(const Value& a, const Value& b, const std::vector<int64_t>& a_contract,
            const std::vector<int64_t>& b_contract, const std::vector<int64_t>& a_batch = {},
            const std::vector<int64_t>& b_batch = {}, bool highest = true);
  // 2-D convolution. `layout` is the dimension_numbers text, e.g.
  // "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]"; padding [[lo, hi], [lo, hi]].
  // --- Collectives (a program for several replicas: set_replicas) ---
  // Sum of x over every replica (stablehlo.all_reduce, one replica group);
  // with `groups` (replica ids: every replica in one group, the groups of one
  // size) over the replicas of each one's group.
  Value AllReduce(const Value& x, int replicas, const std::vector<std::vector<int>>& groups = {});
  // x [K n] on each of the K replicas -> [n]: replica r's part r of the sum
  // over replicas (stablehlo.reduce_scatter along axis 0, one group).
  Value ReduceScatter(const Value& x, int replicas);
  // x [n] on each of the K replicas -> [K n]: every replica's x in replica
  // order (stablehlo.all_gather along axis 0, one group).
  Value AllGather(const Value& x, int replicas);

  Value Convolution(const Value& x, const Value& w, std::string_view layout, const Dims& out_dims,
                    const Dims& strides, const std::vector<Dims>& padding, const Dims& lhs_dilation,
                    const Dims& rhs_dilation, bool highest = true);

 private:
  // One op as Op() took it; Module() prints them.
  struct Instruction {
    std::string name;
    std::vector<Value> args;
    Value out;
    std::string attributes;
    std::string region;
  };
  Value Fresh(const Dims& dims, std::string_view type);
  // stablehlo.scatter combining each place's old and new value by `region`.
  Value Scatter(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                const Dims& inserted, const Dims& index_map, const std::string& region);
  // Folds into the running fingerprint: a word, or bytes (their length first).
  void Mix(uint64_t word);
  void Mix(std::string_view bytes);
  std::vector<Value> parameters_;
  std::vector<int> aliases_;
  std::vector<Value> results_;
  std::vector<Instruction> ops_;
  uint64_t h1_ = 0x243F6A8885A308D3ull, h2_ = 0x13198A2E03707344ull;  // the running fingerprint of ops_
  int next_ = 0;
  int replicas_ = 1;
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_STABLEHLO_H_
