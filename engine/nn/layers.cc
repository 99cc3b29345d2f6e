#include "engine/nn/layers.h"

#include "common/status_macros.h"

namespace troupe::nn {

LinearLayer LinearLayer::Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out) {
  LinearLayer l;
  l.w = params.Add(name + ".w", {in, out}, Init::FanIn(in));
  l.b = params.Add(name + ".b", {out}, Init::FanIn(in));
  return l;
}

Var LinearLayer::operator()(Tape& tape, ParameterSet& params, Var x) const {
  return Linear(x, tape.Parameter(params, w), tape.Parameter(params, b));
}

// Initialised as the whole layer would be (fan-in of the whole input).
ColumnParallelLinear ColumnParallelLinear::Create(ParameterSet& params, const std::string& name, int64_t in,
                                                  int64_t out, int parts) {
  TROUPE_CHECK(parts >= 1 && out % parts == 0);
  ColumnParallelLinear l;
  l.w = params.Add(name + ".w", {in, out / parts}, Init::FanIn(in));
  l.b = params.Add(name + ".b", {out / parts}, Init::FanIn(in));
  return l;
}

Var ColumnParallelLinear::operator()(Tape& tape, ParameterSet& params, Var x, CrossReplicaSum* group) const {
  return Linear(CopyToModelParallel(x, group), tape.Parameter(params, w), tape.Parameter(params, b));
}

RowParallelLinear RowParallelLinear::Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out,
                                            int parts, int part) {
  TROUPE_CHECK(parts >= 1 && in % parts == 0 && part >= 0 && part < parts);
  RowParallelLinear l;
  l.part = part;
  l.w = params.Add(name + ".w", {in / parts, out}, Init::FanIn(in));
  l.b = params.Add(name + ".b", {out}, Init::FanIn(in));
  return l;
}

Var RowParallelLinear::operator()(Tape& tape, ParameterSet& params, Var x, CrossReplicaSum* group) const {
  // The bias once in the sum: part 0's.
  const Var partial = part == 0 ? Linear(x, tape.Parameter(params, w), tape.Parameter(params, b))
                                : MatMul(x, tape.Parameter(params, w));
  return ReduceFromModelParallel(partial, group);
}

Conv2dLayer Conv2dLayer::Create(ParameterSet& params, const std::string& name, int64_t in, int64_t out,
                                int64_t kernel, int64_t stride, int64_t pad) {
  Conv2dLayer l;
  l.w = params.Add(name + ".w", {out, in, kernel, kernel}, Init::FanIn(in * kernel * kernel));
  l.b = params.Add(name + ".b", {out}, Init::FanIn(in * kernel * kernel));
  l.stride = stride;
  l.pad = pad;
  return l;
}

Var Conv2dLayer::operator()(Tape& tape, ParameterSet& params, Var x, FusedActivation act) const {
  return Conv2d(x, tape.Parameter(params, w), tape.Parameter(params, b), stride, pad, act);
}

ConvTranspose2dLayer ConvTranspose2dLayer::Create(ParameterSet& params, const std::string& name, int64_t in,
                                                  int64_t out, int64_t kernel, int64_t stride, int64_t pad,
                                                  int64_t output_pad) {
  ConvTranspose2dLayer l;
  l.w = params.Add(name + ".w", {in, out, kernel, kernel}, Init::FanIn(out * kernel * kernel));
  l.b = params.Add(name + ".b", {out}, Init::FanIn(out * kernel * kernel));
  l.stride = stride;
  l.pad = pad;
  l.output_pad = output_pad;
  return l;
}

Var ConvTranspose2dLayer::operator()(Tape& tape, ParameterSet& params, Var x) const {
  return ConvTranspose2d(x, tape.Parameter(params, w), tape.Parameter(params, b), stride, pad, output_pad);
}

LayerNormLayer LayerNormLayer::Create(ParameterSet& params, const std::string& name, int64_t size) {
  LayerNormLayer l;
  l.gamma = params.Add(name + ".gamma", {size}, Init::Constant(1.0f));
  l.beta = params.Add(name + ".beta", {size}, Init::Zeros());
  return l;
}

Var LayerNormLayer::operator()(Tape& tape, ParameterSet& params, Var x) const {
  return LayerNorm(x, tape.Parameter(params, gamma), tape.Parameter(params, beta));
}

Mlp Mlp::Create(ParameterSet& params, const std::string& name, const std::vector<int64_t>& sizes) {
  TROUPE_CHECK(sizes.size() >= 2);
  Mlp m;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    m.layers.push_back(LinearLayer::Create(params, name + "." + std::to_string(i), sizes[i], sizes[i + 1]));
  }
  return m;
}

Var Mlp::operator()(Tape& tape, ParameterSet& params, Var x) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i](tape, params, x);
    if (i + 1 < layers.size()) x = Relu(x);
  }
  return x;
}

}  // namespace troupe::nn
