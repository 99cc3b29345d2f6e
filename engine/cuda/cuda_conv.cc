// CudaBackend's dense kernels: cuBLAS GEMM (float32, or bfloat16 inputs with
// float32 accumulation), row bias, and convolutions through cuDNN
// (cudnn_conv.h) or as whole-batch im2col + one GEMM.
// Scratch slots, im2col: 0 columns [c*kh*kw, n*P], 1 channel-major
// activations [oc, n*P], 2/3 bfloat16 copies of GEMM operands, 6 the gradient
// through a fused activation [n, oc, P]. cuDNN: 0 a bfloat16 result, 2/3/7
// bfloat16 operands, 6 the gradient through a fused activation.
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels.h"

namespace troupe::cuda {
namespace {
cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

kernels::Conv Flatten(const nn::ConvGeometry& g) {
  return {g.n, g.c, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad, g.oh(), g.ow()};
}
}  // namespace

// cuBLAS is column-major: row-major C[m, n] is column-major C^T[n, m], so
// C^T = op(B)^T op(A)^T is one call with the operands swapped.
void CudaBackend::GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                              const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                              int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  Bound();  // cuBLAS calls run on the handle's device
  auto handle = static_cast<cublasHandle_t>(cublas_);
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // C = beta * C (cuBLAS does this too, but not for every batch layout).
    for (int64_t i = 0; i < batch; ++i) kernels::Scale(AsStream(Bound()), beta, c + i * stride_c, c + i * stride_c, m * n);
    return;
  }
  const void* a_ptr = a;
  const void* b_ptr = b;
  cudaDataType_t input_type = CUDA_R_32F;
  cublasComputeType_t compute = options_.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (options_.gemm_precision == GemmPrecision::kBfloat16) {
    // Round both operands to bfloat16 (whole batches; a zero stride is one matrix).
    const int64_t a_count = (stride_a == 0 ? 0 : stride_a * (batch - 1)) + m * k;
    const int64_t b_count = (stride_b == 0 ? 0 : stride_b * (batch - 1)) + k * n;
    auto* a16 = static_cast<uint16_t*>(Scratch(2, sizeof(uint16_t) * a_count));
    auto* b16 = static_cast<uint16_t*>(Scratch(3, sizeof(uint16_t) * b_count));
    kernels::ToBfloat16(AsStream(Bound()), a, a16, a_count);
    kernels::ToBfloat16(AsStream(Bound()), b, b16, b_count);
    a_ptr = a16;
    b_ptr = b16;
    input_type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  }
  if (batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                              &alpha, b_ptr, input_type, static_cast<int>(ldb), a_ptr, input_type,
                              static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc), compute,
                              CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                            static_cast<int>(k), &alpha, b_ptr, input_type, static_cast<int>(ldb),
                                            stride_b, a_ptr, input_type, static_cast<int>(lda), stride_a, &beta, c,
                                            CUDA_R_32F, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
                                            compute, CUBLAS_GEMM_DEFAULT));
  }
}

void CudaBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       const float* b, float beta, float* c) {
  GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0, beta, c, n, 0, 1);
  Done("Gemm");
}

void CudaBackend::AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
  kernels::AddRowBias(AsStream(Bound()), rows, cols, bias, y);
  Done("AddRowBias");
}

void CudaBackend::RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  kernels::RowBiasBackward(AsStream(Bound()), rows, cols, dy, dbias);
  Done("RowBiasBackward");
}

// --- Convolutions through cuDNN ---------------------------------------------------------
// Each public convolution takes this path when cuDNN runs every pass it needs
// at the backend's precision, else the im2col path below it.

bool CudaBackend::UseCudnn(ConvPass pass, const nn::ConvGeometry& g) {
  if (cudnn_ == nullptr) return false;
  Bound();
  return cudnn_->Supports(pass, g, Bf16() ? ConvDataType::kBfloat16 : ConvDataType::kFloat32);
}

const void* CudaBackend::ConvOperand(int slot, const float* x, int64_t n) {
  if (!Bf16()) return x;
  auto* x16 = static_cast<uint16_t*>(Scratch(slot, sizeof(uint16_t) * n));
  kernels::ToBfloat16(AsStream(Bound()), x, x16, n);
  return x16;
}

void CudaBackend::CudnnPass(ConvPass pass, const nn::ConvGeometry& g, const void* a, const void* b, float* out,
                            int64_t n, bool accumulate) {
  if (!Bf16()) {
    // cuDNN scales and adds in place: out = conv + beta * out.
    cudnn_->Run(pass, g, ConvDataType::kFloat32, a, b, accumulate ? 1.0f : 0.0f, out);
    return;
  }
  auto* result = static_cast<uint16_t*>(Scratch(0, sizeof(uint16_t) * n));
  cudnn_->Run(pass, g, ConvDataType::kBfloat16, a, b, 0.0f, result);
  kernels::AddBfloat16(AsStream(Bound()), n, result, out, accumulate);
}

void CudaBackend::CudnnPassWithBias(ConvPass pass, const nn::ConvGeometry& g, const void* a, const void* b,
                                    const float* bias, bool relu, int64_t channels, int64_t hw, float* y,
                                    const char* stage) {
  if (!Bf16()) {
    cudnn_->Run(pass, g, ConvDataType::kFloat32, a, b, 0.0f, y);
    Stage(stage);
    if (bias != nullptr || relu) kernels::ChannelBiasActivation(AsStream(Bound()), g.n, channels, hw, y, bias, relu, y);
    return;
  }
  // The bfloat16 result to float32 in the same pass as the bias and activation.
  auto* y16 = static_cast<uint16_t*>(Scratch(0, sizeof(uint16_t) * g.n * channels * hw));
  cudnn_->Run(pass, g, ConvDataType::kBfloat16, a, b, 0.0f, y16);
  Stage(stage);
  kernels::ChannelBiasActivation(AsStream(Bound()), g.n, channels, hw, y16, bias, relu, y);
}

// --- Convolutions -------------------------------------------------------------------------

void CudaBackend::Conv2dForward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                                const float* b, float* y) {
  if (UseCudnn(ConvPass::kForward, g)) {
    CudnnPassWithBias(ConvPass::kForward, g, ConvOperand(2, x, g.n * g.c * g.h * g.w),
                      ConvOperand(3, w, g.oc * g.c * g.kh * g.kw), b, act == nn::FusedActivation::kRelu, g.oc,
                      g.oh() * g.ow(), y, "Conv2dForward: cuDNN");
    Done("Conv2dForward");
    return;
  }
  const kernels::Conv k = Flatten(g);
  const int64_t np = g.n * k.oh * k.ow, ckk = g.c * g.kh * g.kw;
  auto* col = static_cast<float*>(Scratch(0, sizeof(float) * ckk * np));
  auto* out = static_cast<float*>(Scratch(1, sizeof(float) * g.oc * np));
  // out[oc, n*P] = w[oc, ckk] * im2col(x)[ckk, n*P]; y = out in [n, oc, P] + b.
  kernels::Im2Col(AsStream(Bound()), k, x, col);
  Stage("Conv2dForward: im2col");
  GemmStrided(false, false, g.oc, np, ckk, 1.0f, w, ckk, 0, col, np, 0, 0.0f, out, np, 0, 1);
  Stage("Conv2dForward: GEMM");
  kernels::ToBatchMajor(AsStream(Bound()), g.n, g.oc, k.oh * k.ow, out, b, y, /*accumulate=*/false);
  if (act == nn::FusedActivation::kRelu) {
    kernels::ActivationForward(AsStream(Bound()), static_cast<int>(nn::Activation::kRelu), 0.0f, y, y, np * g.oc);
  }
  Done("Conv2dForward");
}

void CudaBackend::Conv2dBackward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                                 const float* y, const float* dy, float* dx, float* dw, float* db) {
  const kernels::Conv k = Flatten(g);
  const int64_t p = k.oh * k.ow, np = g.n * p, ckk = g.c * g.kh * g.kw;
  if (act == nn::FusedActivation::kRelu) {
    // Through the ReLU first (y > 0 exactly where its input was).
    auto* dpre = static_cast<float*>(Scratch(6, sizeof(float) * g.oc * np));
    kernels::ReluGradient(AsStream(Bound()), g.oc * np, y, dy, dpre);
    dy = dpre;
  }
  Stage("Conv2dBackward: ReLU");
  // db[oc] += sum of dy over samples and pixels.
  if (db != nullptr) kernels::ChannelSum(AsStream(Bound()), g.n, g.oc, p, dy, db);
  Stage("Conv2dBackward: bias");
  if (UseCudnn(ConvPass::kBackwardFilter, g) && (dx == nullptr || UseCudnn(ConvPass::kBackwardData, g))) {
    const void* dy_op = ConvOperand(7, dy, g.oc * np);
    if (dw != nullptr) {
      CudnnPass(ConvPass::kBackwardFilter, g, ConvOperand(2, x, g.n * g.c * g.h * g.w), dy_op, dw, g.oc * ckk,
                /*accumulate=*/true);
      Stage("Conv2dBackward: cuDNN dw");
    }
    if (dx != nullptr) {
      CudnnPass(ConvPass::kBackwardData, g, dy_op, ConvOperand(3, w, g.oc * ckk), dx, g.n * g.c * g.h * g.w,
                /*accumulate=*/true);
      Stage("Conv2dBackward: cuDNN dx");
    }
    Done("Conv2dBackward");
    return;
  }
  auto* col = static_cast<float*>(Scratch(0, sizeof(float) * ckk * np));
  auto* dy_t = static_cast<float*>(Scratch(1, sizeof(float) * g.oc * np));
  // dw[oc, ckk] += dy^T[oc, n*P] * im2col(x)[ckk, n*P]^T.
  kernels::ToChannelMajor(AsStream(Bound()), g.n, g.oc, p, dy, dy_t);
  Stage("Conv2dBackward: to channel-major");
  if (dw != nullptr) {
    kernels::Im2Col(AsStream(Bound()), k, x, col);
    Stage("Conv2dBackward: im2col");
    GemmStrided(false, true, g.oc, ckk, np, 1.0f, dy_t, np, 0, col, np, 0, 1.0f, dw, ckk, 0, 1);
    Stage("Conv2dBackward: GEMM dw");
  }
  // dx += col2im(w^T[ckk, oc] * dy^T[oc, n*P]) (the columns are reused).
  if (dx != nullptr) {
    GemmStrided(true, false, ckk, np, g.oc, 1.0f, w, ckk, 0, dy_t, np, 0, 0.0f, col, np, 0, 1);
    Stage("Conv2dBackward: GEMM dx");
    kernels::Col2Im(AsStream(Bound()), k, col, dx, /*accumulate=*/true);
  }
  Done("Conv2dBackward");
}

void CudaBackend::ConvTranspose2dForward(const nn::ConvGeometry& g, const float* x, const float* w, const float* b,
                                         float* y) {
  // The transposed conv is the conv's backward data pass: x [n, oc, oh, ow]
  // in, y [n, c, h, w] out.
  if (UseCudnn(ConvPass::kBackwardData, g)) {
    CudnnPassWithBias(ConvPass::kBackwardData, g, ConvOperand(2, x, g.n * g.oc * g.oh() * g.ow()),
                      ConvOperand(3, w, g.oc * g.c * g.kh * g.kw), b, /*relu=*/false, g.c, g.h * g.w, y,
                      "ConvTranspose2dForward: cuDNN");
    Done("ConvTranspose2dForward");
    return;
  }
  const kernels::Conv k = Flatten(g);
  const int64_t p = k.oh * k.ow, np = g.n * p, ckk = g.c * g.kh * g.kw;
  auto* col = static_cast<float*>(Scratch(0, sizeof(float) * ckk * np));
  auto* x_t = static_cast<float*>(Scratch(1, sizeof(float) * g.oc * np));
  // y = col2im(w^T[ckk, oc] * x^T[oc, n*P]) + b.
  kernels::ToChannelMajor(AsStream(Bound()), g.n, g.oc, p, x, x_t);
  GemmStrided(true, false, ckk, np, g.oc, 1.0f, w, ckk, 0, x_t, np, 0, 0.0f, col, np, 0, 1);
  kernels::Col2Im(AsStream(Bound()), k, col, y, /*accumulate=*/false);
  if (b != nullptr) kernels::ChannelBiasActivation(AsStream(Bound()), g.n, g.c, g.h * g.w, y, b, false, y);
  Done("ConvTranspose2dForward");
}

void CudaBackend::ConvTranspose2dBackward(const nn::ConvGeometry& g, const float* x, const float* w, const float* dy,
                                          float* dx, float* dw, float* db) {
  // dy [n, c, h, w] is the conv's input side, x [n, oc, oh, ow] its output
  // side: dw is the conv's filter gradient of (dy, x), dx the conv of dy.
  // db[c] += sum of dy over samples and pixels.
  if (db != nullptr) kernels::ChannelSum(AsStream(Bound()), g.n, g.c, g.h * g.w, dy, db);
  if (UseCudnn(ConvPass::kBackwardFilter, g) && (dx == nullptr || UseCudnn(ConvPass::kForward, g))) {
    const int64_t xs = g.n * g.oc * g.oh() * g.ow(), dys = g.n * g.c * g.h * g.w, ws = g.oc * g.c * g.kh * g.kw;
    const void* dy_op = ConvOperand(2, dy, dys);
    CudnnPass(ConvPass::kBackwardFilter, g, dy_op, ConvOperand(7, x, xs), dw, ws, /*accumulate=*/true);
    if (dx != nullptr) CudnnPass(ConvPass::kForward, g, dy_op, ConvOperand(3, w, ws), dx, xs, /*accumulate=*/true);
    Done("ConvTranspose2dBackward");
    return;
  }
  const kernels::Conv k = Flatten(g);
  const int64_t p = k.oh * k.ow, np = g.n * p, ckk = g.c * g.kh * g.kw;
  auto* col = static_cast<float*>(Scratch(0, sizeof(float) * ckk * np));
  auto* x_t = static_cast<float*>(Scratch(1, sizeof(float) * g.oc * np));
  // The transposed conv's backward is a conv of dy: col = im2col(dy).
  kernels::Im2Col(AsStream(Bound()), k, dy, col);
  // dw[oc, ckk] += x^T[oc, n*P] * col^T.
  kernels::ToChannelMajor(AsStream(Bound()), g.n, g.oc, p, x, x_t);
  GemmStrided(false, true, g.oc, ckk, np, 1.0f, x_t, np, 0, col, np, 0, 1.0f, dw, ckk, 0, 1);
  // dx[n, oc, P] += (w[oc, ckk] * col) back in batch-major order (x_t reused).
  if (dx != nullptr) {
    GemmStrided(false, false, g.oc, np, ckk, 1.0f, w, ckk, 0, col, np, 0, 0.0f, x_t, np, 0, 1);
    kernels::ToBatchMajor(AsStream(Bound()), g.n, g.oc, p, x_t, nullptr, dx, /*accumulate=*/true);
  }
  Done("ConvTranspose2dBackward");
}

}  // namespace troupe::cuda
