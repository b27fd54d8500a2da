// Host rounding helpers of the float64 reference: bf16 / fp16 round-to-nearest-even on known bit patterns (ties,
// subnormals, overflow), exhaustive round trips, and agreement with a brute-force nearest-value oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

float from_u32(uint32_t u) { return std::bit_cast<float>(u); }

bool bf16_is_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }
bool fp16_is_nan(uint16_t b) { return (b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0; }

// Brute-force round-to-nearest-even oracle: the non-negative finite values of a 16-bit format are increasing in
// their bit pattern 0..max_bits; past the largest one the next "value" is inf, with an even pattern (0x7F80 or
// 0x7C00), at the position the exponent step would put it (2^128 for bf16, 2^16 for fp16).
struct Oracle {
  std::vector<double> values;  // value of bits 0..max_bits, then the virtual next value (overflow point)
  uint16_t inf_bits;

  Oracle(uint16_t max_bits, uint16_t inf, double virtual_next, double (*decode)(uint16_t)) : inf_bits(inf) {
    for (uint32_t b = 0; b <= max_bits; ++b) values.push_back(decode(static_cast<uint16_t>(b)));
    values.push_back(virtual_next);
  }

  uint16_t round(float f) const {
    const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
    const double x = std::fabs(static_cast<double>(f));
    if (std::isinf(x)) return static_cast<uint16_t>(sign | inf_bits);
    auto it = std::upper_bound(values.begin(), values.end(), x);  // first value > x
    if (it == values.end()) return static_cast<uint16_t>(sign | inf_bits);
    const size_t hi = static_cast<size_t>(it - values.begin());
    const size_t lo = hi - 1;  // values[lo] <= x (values[0] = 0 <= x)
    size_t pick;
    const double dlo = x - values[lo];
    const double dhi = values[hi] - x;
    if (dlo < dhi) {
      pick = lo;
    } else if (dhi < dlo) {
      pick = hi;
    } else {
      pick = (lo % 2 == 0) ? lo : hi;  // tie: even bit pattern
    }
    const uint16_t bits = pick == values.size() - 1 ? inf_bits : static_cast<uint16_t>(pick);
    return static_cast<uint16_t>(sign | bits);
  }
};

double decode_bf16(uint16_t b) { return bf16_bits_to_float(b); }
double decode_fp16(uint16_t b) { return fp16_bits_to_float(b); }

TEST(ReferenceRounding, Bf16KnownPatterns) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3F800000u, 0x3F80u},  // 1.0
      {0x3F807FFFu, 0x3F80u},  // just below the tie: down
      {0x3F808000u, 0x3F80u},  // tie, kept bit even (0): down
      {0x3F808001u, 0x3F81u},  // just above the tie: up
      {0x3F818000u, 0x3F82u},  // tie, kept bit odd: up to even
      {0xBF808000u, 0xBF80u},  // negative tie: magnitude rounds like the positive one
      {0xBF818000u, 0xBF82u},
      {0x7F7F7FFFu, 0x7F7Fu},  // stays at the largest finite bf16
      {0x7F7F8000u, 0x7F80u},  // tie above the largest finite (odd): rounds to inf
      {0x7F7FFFFFu, 0x7F80u},  // FLT_MAX overflows to inf
      {0xFF7FFFFFu, 0xFF80u},  // -FLT_MAX -> -inf
      {0x00010000u, 0x0001u},  // smallest bf16 subnormal, exact
      {0x00008000u, 0x0000u},  // tie between 0 and the smallest subnormal: 0 (even)
      {0x00008001u, 0x0001u},
      {0x00018000u, 0x0002u},  // subnormal tie, odd: up
      {0x00000001u, 0x0000u},  // smallest float subnormal
      {0x00000000u, 0x0000u},
      {0x80000000u, 0x8000u},  // -0
      {0x7F800000u, 0x7F80u},  // inf
      {0xFF800000u, 0xFF80u},  // -inf
      {0x007FFFFFu, 0x0080u},  // largest float subnormal rounds up to the smallest normal bf16
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16_bits(from_u32(c.in)), c.out) << std::hex << "in 0x" << c.in;
  }
  // NaN stays NaN, including signalling NaNs whose payload sits only in the dropped low bits.
  EXPECT_TRUE(bf16_is_nan(float_to_bf16_bits(from_u32(0x7FC00000u))));
  EXPECT_TRUE(bf16_is_nan(float_to_bf16_bits(from_u32(0x7F800001u))));
  EXPECT_TRUE(bf16_is_nan(float_to_bf16_bits(from_u32(0xFF800001u))));
  EXPECT_EQ(bf16_bits_to_float(0x3F80u), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x7F7Fu), from_u32(0x7F7F0000u));
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(0xFF80u)));
}

TEST(ReferenceRounding, Fp16KnownPatterns) {
  struct Case {
    float in;
    uint16_t out;
  };
  const float sub = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  const Case cases[] = {
      {1.0f, 0x3C00u},
      {-2.0f, 0xC000u},
      {0.1f, 0x2E66u},
      {65504.0f, 0x7BFFu},                    // largest finite
      {std::nextafter(65520.0f, 0.0f), 0x7BFFu},
      {65520.0f, 0x7C00u},                    // tie above 65504 (odd): rounds to inf
      {1.0e6f, 0x7C00u},
      {-1.0e6f, 0xFC00u},
      {1.0f + std::ldexp(1.0f, -11), 0x3C00u},                          // tie, even: down
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3C01u},  // above tie
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3C02u},                      // tie, odd: up
      {std::ldexp(1.0f, -14), 0x0400u},                                  // smallest normal
      {sub, 0x0001u},
      {0.5f * sub, 0x0000u},                                             // tie with 0: even
      {0.5f * sub + std::ldexp(1.0f, -40), 0x0001u},
      {1.5f * sub, 0x0002u},                                             // tie, odd: up
      {2.5f * sub, 0x0002u},                                             // tie, even: down
      {1023.0f * sub, 0x03FFu},                                          // largest subnormal
      {1023.5f * sub, 0x0400u},                                          // tie into the normal range
      {1022.5f * sub, 0x03FEu},
      {std::ldexp(1.0f, -26), 0x0000u},
      {1e-40f, 0x0000u},                                                 // float subnormal
      {-0.0f, 0x8000u},
      {std::numeric_limits<float>::infinity(), 0x7C00u},
      {-std::numeric_limits<float>::infinity(), 0xFC00u},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_fp16_bits(c.in), c.out) << "in " << c.in;
  }
  EXPECT_TRUE(fp16_is_nan(float_to_fp16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(fp16_is_nan(float_to_fp16_bits(from_u32(0x7F800001u))));
  EXPECT_EQ(fp16_bits_to_float(0x0001u), sub);
  EXPECT_EQ(fp16_bits_to_float(0x7BFFu), 65504.0f);
  EXPECT_EQ(fp16_bits_to_float(0xC000u), -2.0f);
  EXPECT_TRUE(std::isinf(fp16_bits_to_float(0x7C00u)));
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(0x7E00u)));
}

TEST(ReferenceRounding, AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    if (bf16_is_nan(bits)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(bits)));
      EXPECT_TRUE(bf16_is_nan(float_to_bf16_bits(bf16_bits_to_float(bits))));
    } else {
      ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(bits)), bits) << std::hex << "bf16 0x" << b;
    }
    if (fp16_is_nan(bits)) {
      EXPECT_TRUE(std::isnan(fp16_bits_to_float(bits)));
      EXPECT_TRUE(fp16_is_nan(float_to_fp16_bits(fp16_bits_to_float(bits))));
    } else {
      ASSERT_EQ(float_to_fp16_bits(fp16_bits_to_float(bits)), bits) << std::hex << "fp16 0x" << b;
    }
  }
}

TEST(ReferenceRounding, MatchesNearestEvenOracle) {
  const Oracle bf16(0x7F7Fu, 0x7F80u, std::ldexp(1.0, 128), decode_bf16);
  const Oracle fp16(0x7BFFu, 0x7C00u, 65536.0, decode_fp16);
  std::mt19937_64 rng(1234);
  std::vector<float> inputs;
  // Random finite floats over every binade.
  std::uniform_int_distribution<uint32_t> any_bits;
  while (inputs.size() < 40000) {
    const float f = from_u32(any_bits(rng));
    if (std::isfinite(f)) inputs.push_back(f);
  }
  // Values in fp16's range (normal and subnormal), and exact ties and their neighbours of both formats.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> tiny(-7e-5f, 7e-5f);
  std::uniform_int_distribution<uint32_t> pattern(0, 0x7FFEu);
  for (int i = 0; i < 20000; ++i) {
    inputs.push_back(in_range(rng));
    inputs.push_back(tiny(rng));
    const uint16_t b = static_cast<uint16_t>(pattern(rng));
    const float bf_tie = from_u32((static_cast<uint32_t>(b) << 16) | 0x8000u);
    if (b < 0x7F7F) {
      inputs.insert(inputs.end(), {bf_tie, std::nextafter(bf_tie, 0.0f), std::nextafter(bf_tie, 1e38f)});
    }
    if (b < 0x7BFF) {
      const float fp_tie = static_cast<float>((fp16.values[b] + fp16.values[b + 1u]) / 2);  // exact in float
      inputs.insert(inputs.end(), {fp_tie, -fp_tie, std::nextafter(fp_tie, 0.0f), std::nextafter(fp_tie, 1e9f)});
    }
  }
  for (float f : inputs) {
    ASSERT_EQ(float_to_bf16_bits(f), bf16.round(f)) << "bf16 of " << f;
    ASSERT_EQ(float_to_fp16_bits(f), fp16.round(f)) << "fp16 of " << f;
  }
}

TEST(ReferenceRounding, RoundToAndBitHelpers) {
  // Doubles go through float first: 1 + 2^-8 + 2^-30 is above the bf16 tie in double, but float drops 2^-30 and
  // the float value is an exact tie, which rounds to even (1.0). A host upload of float data does the same.
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), CODA_BF16), 1.0);
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20), CODA_BF16), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(round_to(0.1, CODA_FP32), static_cast<double>(0.1f));
  EXPECT_EQ(round_to(0.1, CODA_FP16), static_cast<double>(fp16_bits_to_float(0x2E66u)));
  EXPECT_EQ(round_to(1e5, CODA_FP16), std::numeric_limits<double>::infinity());
  EXPECT_EQ(round_to(3.0e38, CODA_BF16), static_cast<double>(bf16_bits_to_float(0x7F62u)));  // float's range
  EXPECT_EQ(to_bits(3.0e38, CODA_BF16), 0x7F62u);
  EXPECT_THROW(round_to(1.0, CODA_INT32), std::invalid_argument);
  EXPECT_THROW(to_bits(1.0, CODA_FP32), std::invalid_argument);

  std::mt19937_64 rng(7);
  const Matrix m = random_activation(3, 5, rng);
  for (coda_dtype dt : {CODA_BF16, CODA_FP16}) {
    const std::vector<uint16_t> bits = to_bits(m, dt);
    ASSERT_EQ(bits.size(), 15u);
    const Matrix back = matrix_from_bits(bits.data(), 3, 5, dt);
    EXPECT_EQ(back.data, round_to(m, dt).data);
    EXPECT_EQ(round_to(back, dt).data, back.data);  // idempotent
    const Vector v = m.data;
    EXPECT_EQ(vector_from_bits(to_bits(v, dt).data(), 15, dt), round_to(v, dt));
  }
  const std::vector<float> f = to_float(m);
  EXPECT_EQ(matrix_from_float(f.data(), 3, 5).data, round_to(m, CODA_FP32).data);
  EXPECT_EQ(vector_from_float(f.data(), 15), round_to(m.data, CODA_FP32));
}

}  // namespace
