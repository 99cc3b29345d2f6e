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
