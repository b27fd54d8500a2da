// Weight layouts and RoPE in float64: gate/up interleaving and RoPE pairing are pure permutations (explicit index
// maps, round trips), give the same SwiGLU output and the same attention scores as HF's layouts, and RoPE stays
// accurate (orthogonal, norm preserving, equal to an independent long-double computation) at positions > 100k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reference/reference.hpp"

namespace {

using namespace coda::ref;

// A [rows, 2] matrix whose row i is (i, -i): permutations can be read back from column 0.
Matrix labelled_rows(int64_t rows) {
  Matrix m(rows, 2);
  for (int64_t i = 0; i < rows; ++i) {
    m(i, 0) = static_cast<double>(i);
    m(i, 1) = -static_cast<double>(i);
  }
  return m;
}

std::vector<int> column0(const Matrix& m) {
  std::vector<int> out;
  for (int64_t i = 0; i < m.rows; ++i) out.push_back(static_cast<int>(m(i, 0)));
  return out;
}

// q . k scores of every (q head, row) against its GQA kv head at every row.
std::vector<double> attention_scores(const Matrix& qkv, const RopeHeads& heads) {
  std::vector<double> s;
  const int64_t hd = heads.head_dim;
  const int32_t group = heads.n_q_heads / heads.n_kv_heads;
  for (int32_t hq = 0; hq < heads.n_q_heads; ++hq) {
    const int64_t q0 = hq * hd;
    const int64_t k0 = (heads.n_q_heads + hq / group) * hd;
    for (int64_t m1 = 0; m1 < qkv.rows; ++m1)
      for (int64_t m2 = 0; m2 < qkv.rows; ++m2) {
        double acc = 0;
        for (int64_t j = 0; j < hd; ++j) acc += qkv(m1, q0 + j) * qkv(m2, k0 + j);
        s.push_back(acc);
      }
  }
  return s;
}

TEST(ReferenceLayout, ExplicitIndexMaps) {
  // Gate/up: stacked [g0 g1 g2; u0 u1 u2] (rows 0-2 gate, 3-5 up) -> g0 u0 g1 u1 g2 u2.
  EXPECT_EQ(column0(interleave_gate_up(labelled_rows(6))), (std::vector<int>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(column0(deinterleave_gate_up(labelled_rows(6))), (std::vector<int>{0, 2, 4, 1, 3, 5}));
  // RoPE pairs, head_dim 8, two heads: new row 2i <- old i, 2i+1 <- old i + 4, per head.
  EXPECT_EQ(column0(pair_rope_rows(labelled_rows(16), 8)),
            (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}));
  EXPECT_EQ(column0(unpair_rope_rows(labelled_rows(8), 8)), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  // Fused q|k|v with 2 q heads, 1 kv head, head_dim 4: q and k heads paired, v rows untouched.
  const RopeHeads heads{2, 1, 4};
  EXPECT_EQ(column0(pair_rope_qkv_rows(labelled_rows(heads.width()), heads)),
            (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 13, 14, 15}));
  // A bias is a one-column matrix.
  EXPECT_EQ(pair_rope_rows(Matrix(4, 1, std::vector<double>{1, 2, 3, 4}), 4).data, (std::vector<double>{1, 3, 2, 4}));
}

TEST(ReferenceLayout, PermutationsRoundTrip) {
  Rng rng(41);
  const Matrix w = random_weight(24, 5, rng);
  EXPECT_EQ(deinterleave_gate_up(interleave_gate_up(w)).data, w.data);
  EXPECT_EQ(interleave_gate_up(deinterleave_gate_up(w)).data, w.data);
  for (const int32_t hd : {2, 4, 8, 12, 24}) {
    EXPECT_EQ(unpair_rope_rows(pair_rope_rows(w, hd), hd).data, w.data) << hd;
    EXPECT_EQ(pair_rope_rows(unpair_rope_rows(w, hd), hd).data, w.data) << hd;
  }
  for (const RopeHeads heads : {RopeHeads{4, 2, 8}, RopeHeads{4, 1, 8}, RopeHeads{1, 1, 2}}) {
    const Matrix wq = random_weight(heads.width(), 3, rng);
    const Matrix paired = pair_rope_qkv_rows(wq, heads);
    EXPECT_EQ(unpair_rope_qkv_rows(paired, heads).data, wq.data);
    for (int64_t r = heads.rotated_width(); r < heads.width(); ++r)
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(paired(r, c), wq(r, c)) << "v row " << r;
  }
  EXPECT_THROW(pair_rope_rows(w, 5), std::invalid_argument);
  EXPECT_THROW(pair_rope_rows(w, 16), std::invalid_argument);  // 24 rows are not whole heads of 16
  EXPECT_THROW(interleave_gate_up(random_weight(5, 2, rng)), std::invalid_argument);
}

// SwiGLU on the interleaved layout == HF's silu(x W_gate^T) * (x W_up^T) with the stacked weights.
TEST(ReferenceLayout, InterleavedGateUpMatchesHfStacked) {
  Rng rng(42);
  const int64_t m_rows = 6, d = 16, f_width = 12;
  const Matrix h = random_activation(m_rows, d, rng);
  const Vector rstd = {0.5, 1.0, 1.5, 0.8, 1.2, 0.9};
  const Matrix w_gate = random_weight(f_width, d, rng);
  const Matrix w_up = random_weight(f_width, d, rng);
  const Matrix gate = linear_rowscale(h, w_gate, rstd);
  const Matrix up = linear_rowscale(h, w_up, rstd);
  Matrix y_hf(m_rows, f_width);
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t i = 0; i < f_width; ++i) y_hf(m, i) = silu(gate(m, i)) * up(m, i);
  const Swiglu gate_up = linear_rowscale_swiglu(h, interleave_gate_up(vstack(w_gate, w_up)), rstd);
  EXPECT_EQ(max_abs_diff(gate_up.y, y_hf), 0.0);  // same dot products, same order: bit-identical
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t i = 0; i < f_width; ++i) {
      EXPECT_EQ(gate_up.z(m, 2 * i), gate(m, i));
      EXPECT_EQ(gate_up.z(m, 2 * i + 1), up(m, i));
    }
}

// Paired RoPE on paired weights gives q, k = the same row permutation of HF rotate-half q, k (v unchanged), so
// every q . k score is unchanged.
TEST(ReferenceLayout, PairedRopeMatchesHfRotateHalf) {
  for (const RopeHeads heads : {RopeHeads{4, 2, 16}, RopeHeads{4, 1, 16}, RopeHeads{2, 2, 8}, RopeHeads{3, 3, 64}}) {
    SCOPED_TRACE("heads " + std::to_string(heads.n_q_heads) + "/" + std::to_string(heads.n_kv_heads) + " hd " +
                 std::to_string(heads.head_dim));
    Rng rng(43);
    const int64_t m_rows = 7, d = 32;
    const Matrix h = random_activation(m_rows, d, rng);
    const Vector rstd = rmsnorm_rstd_rows(h, 1e-5);
    const Matrix w_hf = random_weight(heads.width(), d, rng);
    const Positions pos = {0, 1, 2, 700, 701, 131072, 2000000};
    const Vector inv_freq = rope_inv_freq(heads.head_dim, 10000.0);

    const Matrix qkv_hf = rope_rotate_half(linear_rowscale(h, w_hf, rstd), pos, inv_freq, heads);
    const Matrix qkv = linear_rowscale_rope(h, pair_rope_qkv_rows(w_hf, heads), rstd, pos, inv_freq, heads);
    // The activations' columns carry the weights' row permutation.
    const Matrix qkv_hf_paired = transpose(pair_rope_qkv_rows(transpose(qkv_hf), heads));
    EXPECT_EQ(max_abs_diff(qkv, qkv_hf_paired), 0.0);
    EXPECT_EQ(max_abs_diff(transpose(unpair_rope_qkv_rows(transpose(qkv), heads)), qkv_hf), 0.0);

    const std::vector<double> s = attention_scores(qkv, heads);
    const std::vector<double> s_hf = attention_scores(qkv_hf, heads);
    EXPECT_LE(max_abs_diff(s, s_hf), 1e-14 * (1 + max_abs(s_hf)));
    EXPECT_GT(max_abs_diff(qkv, qkv_hf), 0.0);  // the layouts do differ
  }
}

TEST(ReferenceLayout, RopeAtLargePositions) {
  Rng rng(44);
  const RopeHeads heads{2, 1, 128};
  const Positions pos = {100001, 131071, 250000, 1048575, 2097152, 16777215, 0, 123456789};
  const int64_t m_rows = static_cast<int64_t>(pos.size());
  const Vector inv_freq = rope_inv_freq(heads.head_dim, 500000.0);  // inv_freq[0] = 1: angles up to 1.2e8 rad
  const Matrix z = random_activation(m_rows, heads.width(), rng);
  const Matrix out = rope(z, pos, inv_freq, heads);

  double max_theta_f32_err = 0;
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t i = 0; i < heads.head_dim / 2; ++i) {
      // Independent computation in long double (64-bit mantissa): angle and rotation.
      const long double theta = static_cast<long double>(pos[static_cast<size_t>(m)]) *
                                static_cast<long double>(inv_freq[static_cast<size_t>(i)]);
      const long double c = std::cos(theta), s = std::sin(theta);
      for (int64_t head = 0; head < heads.n_q_heads + heads.n_kv_heads; ++head) {
        const int64_t j = head * heads.head_dim + 2 * i;
        const long double z0 = z(m, j), z1 = z(m, j + 1);
        const double want0 = static_cast<double>(z0 * c - z1 * s);
        const double want1 = static_cast<double>(z1 * c + z0 * s);
        EXPECT_NEAR(out(m, j), want0, 1e-14) << "row " << m << " pair " << i;
        EXPECT_NEAR(out(m, j + 1), want1, 1e-14) << "row " << m << " pair " << i;
        // Each pair keeps its norm.
        const double n_in = std::hypot(z(m, j), z(m, j + 1));
        EXPECT_NEAR(std::hypot(out(m, j), out(m, j + 1)), n_in, 1e-15 * (1 + n_in));
      }
      // What a plain float32 angle would be off by (the reason kernels need care).
      const float theta_f =
          static_cast<float>(pos[static_cast<size_t>(m)]) * static_cast<float>(inv_freq[static_cast<size_t>(i)]);
      max_theta_f32_err = std::max(max_theta_f32_err, static_cast<double>(std::fabs(theta_f - theta)));
    }
    // Position 0 is the identity.
    if (pos[static_cast<size_t>(m)] == 0) {
      for (int64_t j = 0; j < heads.width(); ++j) EXPECT_EQ(out(m, j), z(m, j));
    }
  }
  EXPECT_GT(max_theta_f32_err, 1e-3);
  // Orthogonality: the backward rotation undoes the forward one; v passes through both.
  const RopeBwd back = rope_bwd_zdz(out, out, pos, inv_freq, heads, 64);
  EXPECT_LE(max_abs_diff(back.dz, z), 1e-14);
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t j = heads.rotated_width(); j < heads.width(); ++j) EXPECT_EQ(out(m, j), z(m, j));
  // ||R z||^2 == ||z||^2 row by row, so zdz of (out, out) is (1/d) ||z||^2.
  EXPECT_LE(max_abs_diff(back.zdz, row_dot(z, z, 1.0 / 64)), 1e-13);
}

}  // namespace
