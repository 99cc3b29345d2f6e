#include "engine/nn/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace troupe::nn {

Shape::Shape(std::initializer_list<int64_t> dims) {
  TROUPE_CHECK(dims.size() <= static_cast<size_t>(kMaxRank));
  for (int64_t d : dims) {
    TROUPE_CHECK(d >= 0);
    dims_[rank_++] = d;
  }
}

int64_t Shape::size() const { return Product(0, rank_); }

int64_t Shape::Product(int begin, int end) const {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= dims_[i];
  return n;
}

std::string Shape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims_.begin(), dims_.begin() + rank_, ", "), "]");
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[i] != other.dims_[i]) return false;
  }
  return true;
}

float* AllocateFloats(int64_t count) {
  // Round the byte size up to the alignment, as aligned_alloc requires.
  size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(float);
  bytes = (bytes + 63) / 64 * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  TROUPE_CHECK(p != nullptr);
  std::memset(p, 0, bytes);
  return p;
}

void FreeFloats(float* p) { std::free(p); }

void TensorBuffer::Free::operator()(float* p) const { FreeFloats(p); }

TensorBuffer::TensorBuffer(Shape shape) : data_(AllocateFloats(shape.size())), shape_(shape) {}

}  // namespace troupe::nn
