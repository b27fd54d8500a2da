// Host rounding to bf16 / fp16 / fp32 and the 16-bit conversions used to upload and download device tensors.
#include "reference/reference.hpp"

#include <bit>
#include <cmath>
#include <stdexcept>

namespace coda::ref {

namespace {

void require_16bit(coda_dtype dtype, const char* where) {
  if (dtype != CODA_BF16 && dtype != CODA_FP16) {
    throw std::invalid_argument(std::string("coda::ref::") + where + ": dtype must be CODA_BF16 or CODA_FP16");
  }
}

}  // namespace

uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign and top payload, force quiet
  }
  // Round to nearest even on the low 16 bits: add 0x7FFF plus the lowest kept bit. A carry out of the mantissa
  // moves into the exponent, so the largest finite values correctly round up to inf.
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN (quiet)
  if (abs == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // inf
  const int exp_field = static_cast<int>(abs >> 23);
  if (exp_field == 0) return sign;  // float zero or float subnormal (< 2^-126): far below half of 2^-24
  const int e = exp_field - 127;     // unbiased exponent
  const uint32_t mant = abs & 0x7FFFFFu;
  if (e >= 16) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65536: beyond even the round-up of 65504
  if (e >= -14) {
    // Normal range of fp16: keep 10 of the 23 mantissa bits, round the other 13 to nearest even. A carry
    // propagates into the exponent (and to 0x7C00 = inf past 65504).
    uint32_t half = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Subnormal fp16: the value is full * 2^(e-23) with full = 1.mant; in units of 2^-24 it is full * 2^(e+1).
  const uint32_t full = mant | 0x800000u;
  const int shift = -(e + 1);  // >= 14
  if (shift >= 32) return sign;
  uint32_t q = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (q & 1u))) ++q;  // q may become 0x400: the smallest normal, correct
  return static_cast<uint16_t>(sign | q);
}

float fp16_bits_to_float(uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exp_field = (bits >> 10) & 0x1F;
  const uint32_t mant = bits & 0x3FFu;
  float v;
  if (exp_field == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp_field == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::bit_cast<float>((static_cast<uint32_t>(exp_field - 15 + 127) << 23) | (mant << 13));
  }
  return negative ? -v : v;
}

double round_to(double x, coda_dtype dtype) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case CODA_BF16:
      return bf16_bits_to_float(float_to_bf16_bits(f));
    case CODA_FP16:
      return fp16_bits_to_float(float_to_fp16_bits(f));
    case CODA_FP32:
      return f;
    default:
      throw std::invalid_argument("coda::ref::round_to: dtype must be CODA_BF16, CODA_FP16 or CODA_FP32");
  }
}

Matrix round_to(const Matrix& m, coda_dtype dtype) {
  Matrix out = m;
  for (double& v : out.data) v = round_to(v, dtype);
  return out;
}

Vector round_to(const Vector& v, coda_dtype dtype) {
  Vector out = v;
  for (double& x : out) x = round_to(x, dtype);
  return out;
}

uint16_t to_bits(double x, coda_dtype dtype) {
  require_16bit(dtype, "to_bits");
  const float f = static_cast<float>(x);
  return dtype == CODA_BF16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f);
}

double from_bits(uint16_t bits, coda_dtype dtype) {
  require_16bit(dtype, "from_bits");
  return dtype == CODA_BF16 ? bf16_bits_to_float(bits) : fp16_bits_to_float(bits);
}

std::vector<uint16_t> to_bits(const Matrix& m, coda_dtype dtype) {
  require_16bit(dtype, "to_bits");
  std::vector<uint16_t> out(m.data.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = to_bits(m.data[i], dtype);
  return out;
}

std::vector<uint16_t> to_bits(const Vector& v, coda_dtype dtype) {
  require_16bit(dtype, "to_bits");
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = to_bits(v[i], dtype);
  return out;
}

Matrix matrix_from_bits(const uint16_t* bits, int64_t rows, int64_t cols, coda_dtype dtype) {
  require_16bit(dtype, "matrix_from_bits");
  Matrix m(rows, cols);
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = from_bits(bits[i], dtype);
  return m;
}

Vector vector_from_bits(const uint16_t* bits, int64_t n, coda_dtype dtype) {
  require_16bit(dtype, "vector_from_bits");
  Vector v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = from_bits(bits[i], dtype);
  return v;
}

std::vector<float> to_float(const Matrix& m) { return std::vector<float>(m.data.begin(), m.data.end()); }

std::vector<float> to_float(const Vector& v) { return std::vector<float>(v.begin(), v.end()); }

Matrix matrix_from_float(const float* values, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = values[i];
  return m;
}

Vector vector_from_float(const float* values, int64_t n) { return Vector(values, values + n); }

}  // namespace coda::ref
