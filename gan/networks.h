// The GAN mode's networks for 28x28 grey images (DCGAN, Radford et al. 2016,
// sized for Fashion-MNIST):
//   generator: z [n, noise] -> linear -> [n, 2c, 7, 7] -> BN -> ReLU
//              -> transposed conv 4x4 s2 -> [n, c, 14, 14] -> BN -> ReLU
//              -> transposed conv 4x4 s2 -> [n, 1, 28, 28] -> tanh
//   discriminator: x [n, 1, 28, 28] -> conv 4x4 s2 (c) -> LeakyReLU(0.2)
//              -> conv 4x4 s2 (2c) -> LeakyReLU(0.2) -> linear -> [n, 1],
//              every weight spectrally normalised (Miyato et al. 2018).
// Batch norm is cross-replica batch norm when given a CrossReplicaSum. The
// generator may be split over M replicas (tensor parallelism, Megatron-LM's
// column- then row-parallel pair): part p holds the projection's output
// channels [p 2c/M, (p+1) 2c/M) with their batch norm, and the first
// transposed convolution's input channels of the same range, whose partial
// outputs the M parts sum; the rest is whole on every part. The generator
// keeps no running statistics: evaluation uses batch statistics of
// its (large) evaluation batches.
//
// A network holds parameter indices only (immutable, shared by replicas);
// values live in each replica's ParameterSets.
#ifndef TROUPE_GAN_NETWORKS_H_
#define TROUPE_GAN_NETWORKS_H_

#include <span>

#include "engine/nn/ops.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"

namespace troupe::gan {

class Generator {
 public:
  // Declares the parameters in `params` (allocate afterwards): the whole
  // generator, or with `parts` > 1 one part's (2 x channels must be a
  // multiple of `parts`). The parameters are the same in number, order and
  // name either way; a part's split ones are smaller.
  Generator(nn::ParameterSet& params, int noise_size, int channels, int parts = 1);
  // z [n, noise] -> images [n, 1, 28, 28] in [-1, 1]. `trainable`: gradients
  // flow into params (otherwise the weights are constants on the tape).
  // `cross_replica`: batch norm's sum over the replicas that split the batch;
  // `model`: the sum over the parts of one generator (parts > 1).
  nn::Var Forward(nn::Tape& tape, nn::ParameterSet& params, nn::Var z, bool trainable,
                  nn::CrossReplicaSum* cross_replica, nn::CrossReplicaSum* model = nullptr) const;
  int noise_size() const { return noise_size_; }
  int parts() const { return parts_; }

  // How parameter `index` of a part is cut from the whole generator's: whole,
  // a block of columns of a [rows, cols] matrix, or a block of the leading
  // dimension.
  enum class Split { kWhole, kColumns, kRows };
  Split split(int index) const;
  // Between a buffer laid out as the whole generator's parameters (`whole`:
  // values, or an optimizer's moment) and one laid out as part `part`'s
  // (`part_set`, declared with this generator's parts): `to_whole` copies
  // the part into its place in the whole buffer, otherwise the reverse.
  void CopyPart(const nn::ParameterSet& whole, std::span<float> whole_buffer, const nn::ParameterSet& part_set,
                std::span<float> part_buffer, int part, bool to_whole) const;

 private:
  int noise_size_, channels_, parts_;
  int fc_w_, bn0_gamma_, bn0_beta_, up1_w_, bn1_gamma_, bn1_beta_, up2_w_, up2_b_;
};

class Discriminator {
 public:
  // Declares the weights in `params` and the spectral norm's power-iteration
  // vectors u, v in `power_vectors` (not trained; checkpointed).
  Discriminator(nn::ParameterSet& params, nn::ParameterSet& power_vectors, int channels);
  // images [n, 1, 28, 28] -> scores [n, 1]. `power_iterations` updates u, v
  // first (1 in a discriminator update, 0 elsewhere).
  nn::Var Forward(nn::Tape& tape, nn::ParameterSet& params, nn::ParameterSet& power_vectors, nn::Var x,
                  bool trainable, int power_iterations) const;

 private:
  struct SnWeight {
    int w = -1, u = -1, v = -1;
  };
  nn::Var Weight(nn::Tape& tape, nn::ParameterSet& params, nn::ParameterSet& power_vectors, const SnWeight& w,
                 bool trainable, int power_iterations) const;
  int channels_;
  SnWeight c1_, c2_, fc_;
  int c1_b_, c2_b_, fc_b_;
};

}  // namespace troupe::gan

#endif  // TROUPE_GAN_NETWORKS_H_
