// Float32 tensors: a shape (rank <= 4, row-major, NCHW for images) and views
// over float buffers someone else owns. `TensorBuffer` is the one owning kind
// (64-byte aligned), used for parameters, optimizer state and test data.
//
// Not thread-safe; a view is as valid as the buffer it points into.
#ifndef TROUPE_ENGINE_NN_TENSOR_H_
#define TROUPE_ENGINE_NN_TENSOR_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

namespace troupe::nn {

inline constexpr int kMaxRank = 4;

// A tensor shape: rank 0..4, row-major. Rank 0 is a scalar with one element.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t dim(int i) const { return dims_[i]; }
  int64_t operator[](int i) const { return dims_[i]; }
  // Product of all dimensions (1 for a scalar).
  int64_t size() const;
  // Product of dimensions [begin, end).
  int64_t Product(int begin, int end) const;
  // "[256, 32, 41, 41]".
  std::string ToString() const;

  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// A non-owning view: data pointer plus shape.
struct TensorView {
  float* data = nullptr;
  Shape shape;

  int64_t size() const { return shape.size(); }
  std::span<float> span() const { return {data, static_cast<size_t>(shape.size())}; }
};

// An owning, 64-byte aligned, zero-initialised float buffer with a shape.
class TensorBuffer {
 public:
  TensorBuffer() = default;
  explicit TensorBuffer(Shape shape);

  TensorBuffer(TensorBuffer&&) noexcept = default;
  TensorBuffer& operator=(TensorBuffer&&) noexcept = default;

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  const Shape& shape() const { return shape_; }
  int64_t size() const { return shape_.size(); }
  TensorView view() { return {data_.get(), shape_}; }
  std::span<float> span() { return {data_.get(), static_cast<size_t>(size())}; }
  std::span<const float> span() const { return {data_.get(), static_cast<size_t>(size())}; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  Shape shape_;
};

// Allocates `count` floats aligned to 64 bytes, zero-filled; free with FreeFloats.
float* AllocateFloats(int64_t count);
void FreeFloats(float* p);

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_TENSOR_H_
