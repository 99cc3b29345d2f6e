#include "common/image.h"

#include <png.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"

namespace troupe {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

}  // namespace

absl::Status WritePng(const std::string& path, const Image& image) {
  if (image.channels != 1 && image.channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat("WritePng(", path, "): channels must be 1 or 3, got ", image.channels));
  }
  if (image.pixels.size() != size_t(image.width) * image.height * image.channels || image.width <= 0 || image.height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("WritePng(", path, "): pixel buffer does not match ", image.width, "x", image.height, "x", image.channels));
  }
  const std::string tmp = path + ".tmp";
  FilePtr file(std::fopen(tmp.c_str(), "wb"));
  if (!file) return absl::PermissionDeniedError(absl::StrCat("WritePng: cannot open ", tmp, " for writing"));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("WritePng: libpng failed writing ", tmp));
  }
  png_init_io(png, file.get());
  png_set_IHDR(png, info, image.width, image.height, 8, image.channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < image.height; ++y) {
    png_write_row(png, const_cast<png_bytep>(image.at(0, y)));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fflush(file.get()) != 0) return absl::DataLossError(absl::StrCat("WritePng: flush failed for ", tmp));
  file.reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("WritePng: cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Image> ReadPng(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) return absl::NotFoundError(absl::StrCat("ReadPng: cannot open ", path));
  uint8_t header[8];
  if (std::fread(header, 1, 8, file.get()) != 8 || png_sig_cmp(header, 0, 8) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ReadPng: ", path, " is not a PNG file"));
  }
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  Image image;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::DataLossError(absl::StrCat("ReadPng: ", path, " is truncated or corrupt"));
  }
  png_init_io(png, file.get());
  png_set_sig_bytes(png, 8);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  if (depth != 8 || (color != PNG_COLOR_TYPE_RGB && color != PNG_COLOR_TYPE_GRAY)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return absl::InvalidArgumentError(absl::StrCat("ReadPng: ", path, " must be 8-bit RGB or grey (color type ", color, ", depth ", depth, ")"));
  }
  image = Image(png_get_image_width(png, info), png_get_image_height(png, info), color == PNG_COLOR_TYPE_RGB ? 3 : 1);
  for (int y = 0; y < image.height; ++y) png_read_row(png, image.at(0, y), nullptr);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

Image HorizontalStrip(const std::vector<Image>& images, int gap) {
  if (images.empty()) return Image();
  int width = gap * (static_cast<int>(images.size()) - 1), height = 0;
  for (const Image& image : images) {
    width += image.width;
    height = std::max(height, image.height);
  }
  Image strip(width, height, 3);
  std::fill(strip.pixels.begin(), strip.pixels.end(), 255);
  int x = 0;
  for (const Image& image : images) {
    for (int y = 0; y < image.height; ++y) std::copy_n(image.at(0, y), size_t(image.width) * 3, strip.at(x, y));
    x += image.width + gap;
  }
  return strip;
}

}  // namespace troupe
