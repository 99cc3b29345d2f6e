// Layers: parameter declarations in a ParameterSet plus how to apply them on
// a tape. A layer holds only parameter indices and hyper-parameters (it is
// immutable and can be shared); values live in the replica's ParameterSet.
#ifndef TROUPE_ENGINE_NN_LAYERS_H_
#define TROUPE_ENGINE_NN_LAYERS_H_

#include <string>
#include <vector>

#include "engine/nn/ops.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"

namespace troupe::nn {

// y = x w + b, w [in, out], PyTorch's default initialisation.
struct LinearLayer {
  int w = -1, b = -1;
  static LinearLayer Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out);
  Var operator()(Tape& tape, ParameterSet& params, Var x) const;
};

// A dense layer split over the `parts` replicas of a model-parallel group
// (Megatron-LM's pair): the column-parallel layer keeps part `part` of the
// output columns (w [in, out / parts], b [out / parts]) and gives that part
// of y; the row-parallel layer after it keeps the same part of the input
// rows (w [in / parts, out]) and a bias [out] that part 0 adds (every part
// declares it, so all parts have one layout), and gives the whole y: one
// sum across the group forward (its partial products) and one backward
// (the column layer's input gradient). `group` sums over the group's
// replicas (a ReplicaContext). Each keeps 1/parts of the pair's weights.
struct ColumnParallelLinear {
  int w = -1, b = -1;
  static ColumnParallelLinear Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out,
                                     int parts);
  Var operator()(Tape& tape, ParameterSet& params, Var x, CrossReplicaSum* group) const;
};
struct RowParallelLinear {
  int w = -1, b = -1;
  int part = 0;
  static RowParallelLinear Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out,
                                  int parts, int part);
  // x: the column-parallel layer's part of its output, [batch, in / parts].
  Var operator()(Tape& tape, ParameterSet& params, Var x, CrossReplicaSum* group) const;
};

// 2-D convolution, w [out, in, k, k].
struct Conv2dLayer {
  int w = -1, b = -1;
  int64_t stride = 1, pad = 0;
  static Conv2dLayer Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out, int64_t kernel,
                            int64_t stride, int64_t pad);
  Var operator()(Tape& tape, ParameterSet& params, Var x, FusedActivation act = FusedActivation::kNone) const;
};

// Transposed 2-D convolution, w [in, out, k, k].
struct ConvTranspose2dLayer {
  int w = -1, b = -1;
  int64_t stride = 1, pad = 0, output_pad = 0;
  static ConvTranspose2dLayer Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out,
                                     int64_t kernel, int64_t stride, int64_t pad, int64_t output_pad);
  Var operator()(Tape& tape, ParameterSet& params, Var x) const;
};

// Layer norm over the last axis with learned gain (1) and bias (0).
struct LayerNormLayer {
  int gamma = -1, beta = -1;
  static LayerNormLayer Create(ParameterSet& params, const std::string& name, int64_t size);
  Var operator()(Tape& tape, ParameterSet& params, Var x) const;
};

// Linear layers with ReLU between them (none after the last).
struct Mlp {
  std::vector<LinearLayer> layers;
  static Mlp Create(ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes);
  Var operator()(Tape& tape, ParameterSet& params, Var x) const;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_LAYERS_H_
