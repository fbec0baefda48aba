// The Mat view's shape and type checks (the kernels' contract) and names.
#include "io/tensor/mat.h"

#include "configs/error.h"
#include "io/tensor/quant_blocks.h"

namespace hmoe::cpu {

const char* quant_name(Quant q) { return q == Quant::int8_channel ? "int8_channel" : q == Quant::int4_group ? "int4_group" : q == Quant::ext ? "ext" : "none"; }

Mat Mat::slice_rows(int64_t r0, int64_t r1) const {
  Mat m = *this;
  m.data = row(r0);
  m.rows = r1 - r0;
  if (scales) m.scales = scales + r0 * groups();
  if (zeros) m.zeros = zeros + r0 * groups();
  return m;
}

void check_mat(const Mat& w, const std::string& what) {
  if (w.rows < 0 || w.cols <= 0 || (!w.data && w.rows > 0)) fail(ErrorKind::invalid_argument, what + ": empty or negative shape");
  switch (w.quant) {
    case Quant::none:
      if (w.dtype != DType::f32 && w.dtype != DType::bf16 && w.dtype != DType::f16)
        fail(ErrorKind::unsupported, what + ": dtype " + dtype_name(w.dtype) + " (supported: F32, BF16, F16, int8 per-channel, int4 group-wise)");
      break;
    case Quant::int8_channel:
      if (w.dtype != DType::i8 || !w.scales) fail(ErrorKind::invalid_argument, what + ": int8 per-channel needs dtype I8 and per-row scales");
      break;
    case Quant::ext:
      ext_check(w, what);
      break;
    case Quant::int4_group:
      if (w.group != 32 && w.group != 64 && w.group != 128)
        fail(ErrorKind::unsupported, what + ": int4 group size " + std::to_string(w.group) + " (supported: 32, 64, 128)");
      if (w.cols % w.group != 0)
        fail(ErrorKind::invalid_argument, what + ": " + std::to_string(w.cols) + " columns are not a multiple of the group " + std::to_string(w.group));
      if (w.dtype != DType::u8 || !w.scales) fail(ErrorKind::invalid_argument, what + ": int4 needs packed U8 data and group scales");
      break;
  }
}

std::string mat_type_name(const Mat& w) {
  if (w.quant == Quant::int8_channel) return "int8";
  if (w.quant == Quant::ext) return ext_type_name(w);
  if (w.quant == Quant::int4_group) return "int4-g" + std::to_string(w.group) + (w.zeros ? "-asym" : "-sym");
  return w.dtype == DType::bf16 ? "bf16" : w.dtype == DType::f16 ? "f16" : "f32";
}

}  // namespace hmoe::cpu
