// Weight layouts (MATH.md "Layouts"): pure row permutations done once at load/save time.
//   gate/up interleaved: row 2i <- gate i, row 2i+1 <- up i (from HF's stacked [W_gate; W_up]);
//   RoPE pairs adjacent: inside each q/k head, row 2i <- row i, row 2i+1 <- row i + hd/2 (v not permuted).
#include "reference/reference.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

void copy_row(const Matrix& src, int64_t from, Matrix& dst, int64_t to) {
  std::copy(src.row(from), src.row(from) + src.cols, dst.row(to));
}

// Row map of the RoPE pairing inside one head: paired row 2i <- rotate-half row i, 2i+1 <- i + hd/2.
int64_t rotate_half_row_of_paired(int64_t paired_row, int64_t head_dim) {
  return paired_row % 2 == 0 ? paired_row / 2 : paired_row / 2 + head_dim / 2;
}

// Applies the pairing (or its inverse) to rows [begin, end) of w, which hold whole heads.
void permute_heads(const Matrix& w, Matrix& out, int64_t begin, int64_t end, int64_t head_dim, bool inverse) {
  for (int64_t base = begin; base < end; base += head_dim) {
    for (int64_t r = 0; r < head_dim; ++r) {
      const int64_t src = rotate_half_row_of_paired(r, head_dim);
      if (inverse) {
        copy_row(w, base + r, out, base + src);
      } else {
        copy_row(w, base + src, out, base + r);
      }
    }
  }
}

void check_heads(const RopeHeads& heads, int64_t rows, const char* where) {
  if (heads.head_dim < 2 || heads.head_dim % 2 != 0 || heads.n_q_heads < 1 || heads.n_kv_heads < 1 ||
      rows != heads.width()) {
    throw std::invalid_argument(std::string("coda::ref::") + where +
                                ": w_qkv must be [(Hq+2Hkv)hd, K] with even head_dim and >= 1 heads");
  }
}

}  // namespace

Matrix interleave_gate_up(const Matrix& w_stacked) {
  require(w_stacked.rows % 2 == 0, "interleave_gate_up: w must be [2F,K]");
  const int64_t f = w_stacked.rows / 2;
  Matrix out(w_stacked.rows, w_stacked.cols);
  for (int64_t i = 0; i < f; ++i) {
    copy_row(w_stacked, i, out, 2 * i);          // gate i
    copy_row(w_stacked, f + i, out, 2 * i + 1);  // up i
  }
  return out;
}

Matrix deinterleave_gate_up(const Matrix& w_interleaved) {
  require(w_interleaved.rows % 2 == 0, "deinterleave_gate_up: w must be [2F,K]");
  const int64_t f = w_interleaved.rows / 2;
  Matrix out(w_interleaved.rows, w_interleaved.cols);
  for (int64_t i = 0; i < f; ++i) {
    copy_row(w_interleaved, 2 * i, out, i);
    copy_row(w_interleaved, 2 * i + 1, out, f + i);
  }
  return out;
}

Matrix pair_rope_rows(const Matrix& w, int32_t head_dim) {
  require(head_dim >= 2 && head_dim % 2 == 0 && w.rows % head_dim == 0,
          "pair_rope_rows: need even head_dim dividing the row count");
  Matrix out(w.rows, w.cols);
  permute_heads(w, out, 0, w.rows, head_dim, false);
  return out;
}

Matrix unpair_rope_rows(const Matrix& w, int32_t head_dim) {
  require(head_dim >= 2 && head_dim % 2 == 0 && w.rows % head_dim == 0,
          "unpair_rope_rows: need even head_dim dividing the row count");
  Matrix out(w.rows, w.cols);
  permute_heads(w, out, 0, w.rows, head_dim, true);
  return out;
}

Matrix pair_rope_qkv_rows(const Matrix& w_qkv, const RopeHeads& heads) {
  check_heads(heads, w_qkv.rows, "pair_rope_qkv_rows");
  Matrix out = w_qkv;  // v rows stay
  permute_heads(w_qkv, out, 0, heads.rotated_width(), heads.head_dim, false);
  return out;
}

Matrix unpair_rope_qkv_rows(const Matrix& w_qkv, const RopeHeads& heads) {
  check_heads(heads, w_qkv.rows, "unpair_rope_qkv_rows");
  Matrix out = w_qkv;
  permute_heads(w_qkv, out, 0, heads.rotated_width(), heads.head_dim, true);
  return out;
}

}  // namespace coda::ref
