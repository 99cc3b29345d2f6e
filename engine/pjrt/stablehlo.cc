#include "engine/pjrt/stablehlo.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace troupe::pjrt {
namespace {

// A malformed program is a bug in the kernel that builds it: fail at the op.
void Require(bool ok, std::string_view op, const std::string& why) {
  if (ok) return;
  std::fprintf(stderr, "stablehlo: %.*s: %s\n", static_cast<int>(op.size()), op.data(), why.c_str());
  std::abort();
}

std::string DimsText(const Dims& d) { return absl::StrJoin(d, "x"); }
std::string I64Array(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : absl::StrCat("array<i64: ", absl::StrJoin(v, ", "), ">");
}
std::string List(const std::vector<int64_t>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }
bool Contains(const Dims& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The region combining two `type` scalars that reductions, all-reduces and
// scatters take: `op` ("add", "maximum") of both, or with `op` empty the
// second (a scatter that replaces).
std::string ScalarRegion(std::string_view op, std::string_view type) {
  const std::string s = TensorType({}, type);
  const std::string body =
      op.empty() ? std::string()
                 : absl::StrCat("      %r = \"stablehlo.", std::string(op), "\"(%lhs, %rhs) : (", s, ", ", s, ") -> ",
                                s, "\n");
  return absl::StrCat("{\n    ^bb0(%lhs: ", s, ", %rhs: ", s, "):\n", body, "      \"stablehlo.return\"(",
                      op.empty() ? "%rhs" : "%r", ") : (", s, ") -> ()\n    }");
}

}  // namespace

int64_t Value::size() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string TensorType(const Dims& dims, std::string_view type) {
  return dims.empty() ? absl::StrCat("tensor<", std::string(type), ">")
                      : absl::StrCat("tensor<", DimsText(dims), "x", std::string(type), ">");
}
std::string TensorType(const Value& v) { return TensorType(v.dims, v.type); }

std::string FloatLiteral(double v) {
  Require(std::isfinite(v), "constant", "not finite");
  return absl::StrFormat("%.9e", v);
}

Value Function::Fresh(const Dims& dims, std::string_view type) {
  return {absl::StrCat("%", next_++), dims, std::string(type)};
}

Value Function::Parameter(const Dims& dims, std::string_view type) {
  Value v{absl::StrCat("%arg", parameters_.size()), dims, std::string(type)};
  parameters_.push_back(v);
  aliases_.push_back(-1);
  return v;
}

void Function::AliasParameter(int parameter, int output) { aliases_.at(parameter) = output; }

void Function::Return(const std::vector<Value>& results) { results_ = results; }

std::string Function::Module() const {
  std::vector<std::string> params, result_types, result_ids;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    std::string p = absl::StrCat(parameters_[i].id, ": ", TensorType(parameters_[i]));
    if (aliases_[i] >= 0) absl::StrAppend(&p, " {tf.aliasing_output = ", aliases_[i], " : i32}");
    params.push_back(std::move(p));
  }
  for (const Value& r : results_) {
    result_types.push_back(TensorType(r));
    result_ids.push_back(r.id);
  }
  std::string body;
  for (const Instruction& op : ops_) {
    std::vector<std::string> ids, types;
    for (const Value& a : op.args) {
      ids.push_back(a.id);
      types.push_back(TensorType(a));
    }
    absl::StrAppend(&body, "    ", op.out.id, " = \"stablehlo.", op.name, "\"(", absl::StrJoin(ids, ", "), ")",
                    op.region.empty() ? "" : absl::StrCat(" (", op.region, ")"),
                    op.attributes.empty() ? "" : absl::StrCat(" {", op.attributes, "}"), " : (",
                    absl::StrJoin(types, ", "), ") -> ", TensorType(op.out), "\n");
  }
  const std::string attributes =
      replicas_ > 1 ? absl::StrCat(" attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = ", replicas_, " : i32}")
                    : std::string();
  return absl::StrCat("module @troupe_kernel", attributes, " {\n  func.func public @main(", absl::StrJoin(params, ", "),
                      ") -> (", absl::StrJoin(result_types, ", "), ") {\n", body, "    return ",
                      absl::StrJoin(result_ids, ", "), " : ", absl::StrJoin(result_types, ", "), "\n  }\n}\n");
}

void Function::Mix(uint64_t word) {
  // Two lanes of multiply-rotate; Fingerprint() finishes each with a full avalanche.
  h1_ = std::rotl((h1_ ^ word) * 0x9E3779B97F4A7C15ull, 31) * 0xBF58476D1CE4E5B9ull;
  h2_ = std::rotl(h2_ + word * 0x94D049BB133111EBull, 27) ^ h1_;
}

void Function::Mix(std::string_view bytes) {
  Mix(static_cast<uint64_t>(bytes.size()));
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    Mix(word);
  }
  if (i < bytes.size()) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, bytes.size() - i);
    Mix(word);
  }
}

Fingerprint Function::fingerprint() const {
  // What Module() prints besides the ops: parameters, aliases, results, replicas.
  Function f;
  f.h1_ = h1_;
  f.h2_ = h2_;
  f.Mix(static_cast<uint64_t>(ops_.size()));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    f.Mix(parameters_[i].type);
    for (int64_t d : parameters_[i].dims) f.Mix(static_cast<uint64_t>(d));
    f.Mix(static_cast<uint64_t>(static_cast<int64_t>(aliases_[i])));
  }
  for (const Value& r : results_) f.Mix(r.id);
  f.Mix(static_cast<uint64_t>(replicas_));
  // MurmurHash3's 64-bit finalizer on each lane.
  auto avalanche = [](uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
  };
  return {avalanche(f.h1_), avalanche(f.h2_ ^ f.h1_)};
}

Value Function::Op(std::string_view name, std::vector<Value> args, const Dims& dims, std::string_view type,
                   std::string_view attributes, std::string_view region) {
  Value out = Fresh(dims, type);
  // The text Module() prints for this op follows from these (operand types
  // from their ids: each id was defined, with its type, before).
  Mix(name);
  Mix(static_cast<uint64_t>(args.size()));
  for (const Value& a : args) Mix(a.id);
  Mix(type);
  Mix(static_cast<uint64_t>(dims.size()));
  for (int64_t d : dims) Mix(static_cast<uint64_t>(d));
  Mix(attributes);
  Mix(region);
  ops_.push_back({std::string(name), std::move(args), out, std::string(attributes), std::string(region)});
  return out;
}

Value Function::Constant(double v, std::string_view type, const Dims& dims) {
  const bool is_float = type == "f32" || type == "bf16" || type == "f64";
  const std::string literal = is_float ? FloatLiteral(v) : absl::StrCat(static_cast<int64_t>(v));
  return Op("constant", {}, dims, type, absl::StrCat("value = dense<", literal, "> : ", TensorType(dims, type)));
}

Value Function::Iota(const Dims& dims, int axis, std::string_view type) {
  Require(axis >= 0 && axis < static_cast<int>(dims.size()), "iota", "axis out of range");
  return Op("iota", {}, dims, type, absl::StrCat("iota_dimension = ", axis, " : i64"));
}

Value Function::Reshape(const Value& x, const Dims& dims) {
  Value probe{"", dims, x.type};
  Require(probe.size() == x.size(), "reshape", absl::StrCat(TensorType(x), " to ", TensorType(dims, x.type)));
  if (x.dims == dims) return x;
  return Op("reshape", {x}, dims, x.type);
}

Value Function::Broadcast(const Value& x, const Dims& dims, const std::vector<int64_t>& map) {
  Require(map.size() == x.dims.size(), "broadcast_in_dim", "one target axis per operand axis");
  for (size_t i = 0; i < map.size(); ++i) {
    Require(map[i] < static_cast<int64_t>(dims.size()) && (x.dims[i] == dims[map[i]] || x.dims[i] == 1),
            "broadcast_in_dim", absl::StrCat(TensorType(x), " to ", TensorType(dims, x.type)));
  }
  if (x.dims == dims) return x;
  return Op("broadcast_in_dim", {x}, dims, x.type, absl::StrCat("broadcast_dimensions = ", I64Array(map)));
}

Value Function::Splat(const Value& x, const Dims& dims) {
  if (x.dims == dims) return x;
  Require(x.dims.empty(), "splat", absl::StrCat(TensorType(x), " is not a scalar or of ", DimsText(dims)));
  return Broadcast(x, dims, {});
}

Value Function::Transpose(const Value& x, const std::vector<int64_t>& permutation) {
  Require(permutation.size() == x.dims.size(), "transpose", "permutation rank");
  Dims dims;
  for (int64_t p : permutation) dims.push_back(x.dims.at(p));
  return Op("transpose", {x}, dims, x.type, absl::StrCat("permutation = ", I64Array(permutation)));
}

Value Function::Slice(const Value& x, const Dims& start, const Dims& limit) {
  Require(start.size() == x.dims.size() && limit.size() == x.dims.size(), "slice", "rank");
  Dims dims;
  for (size_t i = 0; i < start.size(); ++i) {
    Require(0 <= start[i] && start[i] <= limit[i] && limit[i] <= x.dims[i], "slice",
            absl::StrCat("[", start[i], ":", limit[i], "] of ", TensorType(x)));
    dims.push_back(limit[i] - start[i]);
  }
  if (dims == x.dims) return x;
  return Op("slice", {x}, dims, x.type,
            absl::StrCat("start_indices = ", I64Array(start), ", limit_indices = ", I64Array(limit),
                         ", strides = ", I64Array(Dims(start.size(), 1))));
}

Value Function::Pad(const Value& x, const Value& value, const Dims& lo, const Dims& hi) {
  Require(lo.size() == x.dims.size() && hi.size() == x.dims.size() && value.dims.empty(), "pad", "rank");
  Dims dims;
  bool identity = true;
  for (size_t i = 0; i < lo.size(); ++i) {
    dims.push_back(x.dims[i] + lo[i] + hi[i]);
    Require(dims.back() >= 0, "pad", "negative size");
    identity = identity && lo[i] == 0 && hi[i] == 0;
  }
  if (identity) return x;
  return Op("pad", {x, value}, dims, x.type,
            absl::StrCat("edge_padding_low = ", I64Array(lo), ", edge_padding_high = ", I64Array(hi),
                         ", interior_padding = ", I64Array(Dims(lo.size(), 0))));
}

Value Function::Concatenate(const std::vector<Value>& parts, int axis) {
  Require(!parts.empty(), "concatenate", "no operand");
  if (parts.size() == 1) return parts[0];
  Dims dims = parts[0].dims;
  dims.at(axis) = 0;
  for (const Value& p : parts) dims[axis] += p.dims.at(axis);
  return Op("concatenate", parts, dims, parts[0].type, absl::StrCat("dimension = ", axis, " : i64"));
}

Value Function::Convert(const Value& x, std::string_view type) {
  if (x.type == type) return x;
  return Op("convert", {x}, x.dims, type);
}

Value Function::BitcastConvert(const Value& x, const Dims& dims, std::string_view type) {
  return Op("bitcast_convert", {x}, dims, type);
}

Value Function::UpdateSlice(const Value& x, const Value& update, const Dims& offsets) {
  Require(update.type == x.type && update.dims.size() == x.dims.size() && offsets.size() == x.dims.size(),
          "dynamic_update_slice", absl::StrCat(TensorType(update), " into ", TensorType(x)));
  for (size_t i = 0; i < offsets.size(); ++i) {
    Require(offsets[i] >= 0 && offsets[i] + update.dims[i] <= x.dims[i], "dynamic_update_slice",
            absl::StrCat("offset ", offsets[i], " of ", TensorType(update), " into ", TensorType(x)));
  }
  if (update.dims == x.dims) return update;
  std::vector<Value> args = {x, update};
  for (int64_t o : offsets) args.push_back(Constant(static_cast<double>(o), "i64"));
  return Op("dynamic_update_slice", args, x.dims, x.type);
}

Value Function::Gather(const Value& x, const Value& indices, const Dims& offset_dims, const Dims& collapsed,
                       const Dims& start_index_map, const Dims& slice_sizes) {
  Require(indices.type == "i32" && indices.rank() >= 1 && indices.dims.back() == static_cast<int64_t>(start_index_map.size()),
          "gather", absl::StrCat(TensorType(indices), " as index vectors of ", start_index_map.size()));
  Require(static_cast<int>(slice_sizes.size()) == x.rank() &&
              offset_dims.size() + collapsed.size() == slice_sizes.size() && std::is_sorted(offset_dims.begin(), offset_dims.end()),
          "gather", "slice_sizes, offset_dims and collapsed_slice_dims do not fit the operand's rank");
  const int rank = indices.rank() - 1 + static_cast<int>(offset_dims.size());
  Dims dims(rank);
  int64_t batch = 0, window = 0;
  for (int i = 0; i < rank; ++i) {
    if (Contains(offset_dims, i)) {
      while (Contains(collapsed, window)) {
        Require(slice_sizes[window] == 1, "gather", "a collapsed axis of slice size other than 1");
        ++window;
      }
      dims[i] = slice_sizes[window++];
    } else {
      dims[i] = indices.dims[batch++];
    }
  }
  for (int64_t a = 0; a < x.rank(); ++a) {
    Require(slice_sizes[a] >= 0 && slice_sizes[a] <= x.dims[a], "gather", "a slice larger than the operand");
  }
  return Op("gather", {x, indices}, dims, x.type,
            absl::StrCat("dimension_numbers = #stablehlo.gather<offset_dims = ", List(offset_dims),
                         ", collapsed_slice_dims = ", List(collapsed), ", start_index_map = ", List(start_index_map),
                         ", index_vector_dim = ", indices.rank() - 1, ">, slice_sizes = ", I64Array(slice_sizes),
                         ", indices_are_sorted = false"));
}

Value Function::Scatter(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                        const Dims& inserted, const Dims& index_map, const std::string& region) {
  Require(indices.type == "i32" && indices.rank() >= 1 && indices.dims.back() == static_cast<int64_t>(index_map.size()),
          "scatter", absl::StrCat(TensorType(indices), " as index vectors of ", index_map.size()));
  Require(updates.type == x.type && updates.rank() == indices.rank() - 1 + static_cast<int>(window_dims.size()) &&
              window_dims.size() + inserted.size() == static_cast<size_t>(x.rank()),
          "scatter", absl::StrCat(TensorType(updates), " as updates of ", TensorType(x)));
  return Op("scatter", {x, indices, updates}, x.dims, x.type,
            absl::StrCat("scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ", List(window_dims),
                         ", inserted_window_dims = ", List(inserted), ", scatter_dims_to_operand_dims = ",
                         List(index_map), ", index_vector_dim = ", indices.rank() - 1,
                         ">, indices_are_sorted = false, unique_indices = false"),
            region);
}

Value Function::ScatterAdd(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                           const Dims& inserted, const Dims& index_map) {
  return Scatter(x, indices, updates, window_dims, inserted, index_map, ScalarRegion("add", x.type));
}

Value Function::ScatterReplace(const Value& x, const Value& indices, const Value& updates, const Dims& window_dims,
                               const Dims& inserted, const Dims& index_map) {
  return Scatter(x, indices, updates, window_dims, inserted, index_map, ScalarRegion("", x.type));
}

Value Function::Reverse(const Value& x, const std::vector<int64_t>& axes) {
  return Op("reverse", {x}, x.dims, x.type, absl::StrCat("dimensions = ", I64Array(axes)));
}

Value Function::Binary(std::string_view op, const Value& a, const Value& b) {
  const Value& shaped = a.dims.empty() ? b : a;
  const Value x = Splat(a, shaped.dims), y = Splat(b, shaped.dims);
  Require(x.type == y.type, op, absl::StrCat(TensorType(x), " and ", TensorType(y)));
  return Op(op, {x, y}, shaped.dims, x.type);
}

Value Function::Unary(std::string_view op, const Value& x) { return Op(op, {x}, x.dims, x.type); }

Value Function::Compare(const Value& a, const Value& b, std::string_view direction) {
  const Value& shaped = a.dims.empty() ? b : a;
  const Value x = Splat(a, shaped.dims), y = Splat(b, shaped.dims);
  Require(x.type == y.type, "compare", absl::StrCat(TensorType(x), " and ", TensorType(y)));
  return Op("compare", {x, y}, shaped.dims, "i1",
            absl::StrCat("comparison_direction = #stablehlo<comparison_direction ", std::string(direction), ">"));
}

Value Function::Select(const Value& predicate, const Value& on_true, const Value& on_false) {
  const Value t = Splat(on_true, predicate.dims), f = Splat(on_false, predicate.dims);
  return Op("select", {predicate, t, f}, predicate.dims, t.type);
}

Value Function::Clamp(const Value& lo, const Value& x, const Value& hi) {
  return Op("clamp", {lo, x, hi}, x.dims, x.type);
}

Value Function::Reduce(const Value& x, const std::vector<int64_t>& axes, std::string_view op) {
  if (axes.empty()) return x;
  const bool add = op == "add";
  Require(add || op == "maximum", "reduce", "add or maximum");
  const Value init = add ? Constant(0.0, x.type) : Constant(-3.4028234663852886e38, x.type);
  Dims dims;
  for (int i = 0; i < x.rank(); ++i) {
    bool reduced = false;
    for (int64_t a : axes) reduced = reduced || a == i;
    if (!reduced) dims.push_back(x.dims[i]);
  }
  return Op("reduce", {x, init}, dims, x.type, absl::StrCat("dimensions = ", I64Array(axes)),
            ScalarRegion(op, x.type));
}

namespace {
// The replica_groups attribute of a collective over `replicas` replicas:
// `groups` (each replica in one group, the groups of one size), or one group
// of every replica when empty (no channel: cross-replica collectives).
std::string ReplicaGroupsAttribute(std::string_view op, int replicas, std::vector<std::vector<int>> groups) {
  if (groups.empty()) {
    groups.emplace_back(replicas);
    for (int r = 0; r < replicas; ++r) groups[0][r] = r;
  }
  std::vector<int> seen(replicas, 0);
  std::vector<std::string> rows;
  for (const std::vector<int>& g : groups) {
    Require(!g.empty() && g.size() == groups.front().size(), op, "replica groups of one size");
    for (int r : g) Require(r >= 0 && r < replicas && !seen[r]++, op, "each replica in one group");
    rows.push_back(absl::StrCat("[", absl::StrJoin(g, ", "), "]"));
  }
  Require(static_cast<int64_t>(rows.size() * groups.front().size()) == replicas, op, "every replica in a group");
  return absl::StrCat("replica_groups = dense<[", absl::StrJoin(rows, ", "), "]> : tensor<", groups.size(), "x",
                      groups.front().size(), "xi64>");
}
}  // namespace

Value Function::AllReduce(const Value& x, int replicas, const std::vector<std::vector<int>>& groups) {
  Require(replicas > 1 && replicas == replicas_, "all_reduce", "the module's replica count (set_replicas) first");
  return Op("all_reduce", {x}, x.dims, x.type, ReplicaGroupsAttribute("all_reduce", replicas, groups),
            ScalarRegion("add", x.type));
}

Value Function::ReduceScatter(const Value& x, int replicas) {
  Require(replicas > 1 && replicas == replicas_, "reduce_scatter", "the module's replica count (set_replicas) first");
  Require(x.rank() == 1 && x.dims[0] % replicas == 0, "reduce_scatter",
          absl::StrCat(TensorType(x), ": one axis of a multiple of ", replicas, " elements"));
  return Op("reduce_scatter", {x}, {x.dims[0] / replicas}, x.type,
            absl::StrCat("scatter_dimension = 0 : i64, ", ReplicaGroupsAttribute("reduce_scatter", replicas, {})),
            ScalarRegion("add", x.type));
}

Value Function::AllGather(const Value& x, int replicas) {
  Require(replicas > 1 && replicas == replicas_, "all_gather", "the module's replica count (set_replicas) first");
  Require(x.rank() == 1, "all_gather", absl::StrCat(TensorType(x), ": one axis"));
  return Op("all_gather", {x}, {x.dims[0] * replicas}, x.type,
            absl::StrCat("all_gather_dim = 0 : i64, ", ReplicaGroupsAttribute("all_gather", replicas, {})));
}

namespace {
std::string PrecisionConfig(bool highest) {
  const char* p = highest ? "HIGHEST" : "DEFAULT";
  return absl::StrCat("precision_config = [#stablehlo<precision ", p, ">, #stablehlo<precision ", p, ">]");
}
}  // namespace

Value Function::Dot(const Value& a, const Value& b, const std::vector<int64_t>& a_contract,
                    const std::vector<int64_t>& b_contract, const std::vector<int64_t>& a_batch,
                    const std::vector<int64_t>& b_batch, bool highest) {
  Require(a_contract.size() == b_contract.size() && a_batch.size() == b_batch.size(), "dot_general", "axes");
  auto in = [](int64_t i, const std::vector<int64_t>& v) {
    for (int64_t x : v) {
      if (x == i) return true;
    }
    return false;
  };
  Dims dims;
  for (int64_t i : a_batch) dims.push_back(a.dims.at(i));
  for (size_t k = 0; k < a_contract.size(); ++k) {
    Require(a.dims.at(a_contract[k]) == b.dims.at(b_contract[k]), "dot_general",
            absl::StrCat("contracting ", TensorType(a), " with ", TensorType(b)));
  }
  for (int i = 0; i < a.rank(); ++i) {
    if (!in(i, a_contract) && !in(i, a_batch)) dims.push_back(a.dims[i]);
  }
  for (int i = 0; i < b.rank(); ++i) {
    if (!in(i, b_contract) && !in(i, b_batch)) dims.push_back(b.dims[i]);
  }
  std::vector<std::string> fields;
  if (!a_batch.empty()) {
    fields.push_back(absl::StrCat("lhs_batching_dimensions = ", List(a_batch)));
    fields.push_back(absl::StrCat("rhs_batching_dimensions = ", List(b_batch)));
  }
  fields.push_back(absl::StrCat("lhs_contracting_dimensions = ", List(a_contract)));
  fields.push_back(absl::StrCat("rhs_contracting_dimensions = ", List(b_contract)));
  return Op("dot_general", {a, b}, dims, "f32",
            absl::StrCat("dot_dimension_numbers = #stablehlo.dot<", absl::StrJoin(fields, ", "), ">, ",
                         PrecisionConfig(highest)));
}

Value Function::Convolution(const Value& x, const Value& w, std::string_view layout, const Dims& out_dims,
                            const Dims& strides, const std::vector<Dims>& padding, const Dims& lhs_dilation,
                            const Dims& rhs_dilation, bool highest) {
  std::vector<std::string> pads;
  for (const Dims& p : padding) pads.push_back(List(p));
  return Op("convolution", {x, w}, out_dims, "f32",
            absl::StrCat("dimension_numbers = #stablehlo.conv<", std::string(layout), ">, window_strides = ",
                         I64Array(strides), ", padding = dense<[", absl::StrJoin(pads, ", "), "]> : tensor<",
                         padding.size(), "x2xi64>, lhs_dilation = ", I64Array(lhs_dilation),
                         ", rhs_dilation = ", I64Array(rhs_dilation),
                         ", feature_group_count = 1 : i64, batch_group_count = 1 : i64, ", PrecisionConfig(highest)));
}

}  // namespace troupe::pjrt
