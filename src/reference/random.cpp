// Random test inputs of realistic scale (PROTOCOL.md): never zero, never constant; seeded by the caller.
#include "reference/reference.hpp"

#include <cmath>
#include <stdexcept>

namespace coda::ref {

Matrix random_normal(int64_t rows, int64_t cols, double mean, double stddev, Rng& rng) {
  std::normal_distribution<double> dist(mean, stddev);
  Matrix m(rows, cols);
  for (double& v : m.data) {
    do {
      v = dist(rng);
    } while (v == 0.0);  // exact zero is (almost) impossible; excluded anyway so no input is ever 0
  }
  return m;
}

Matrix random_weight(int64_t out_features, int64_t in_features, Rng& rng, double stddev) {
  return random_normal(out_features, in_features, 0.0, stddev, rng);
}

Matrix random_activation(int64_t rows, int64_t cols, Rng& rng) { return random_normal(rows, cols, 0.0, 1.0, rng); }

Matrix random_residual(int64_t rows, int64_t cols, Rng& rng) { return random_normal(rows, cols, 0.0, 4.0, rng); }

Vector random_gamma(int64_t n, Rng& rng) {
  std::uniform_real_distribution<double> dist(0.5, 1.5);
  Vector g(static_cast<size_t>(n));
  for (double& v : g) v = dist(rng);
  return g;
}

Positions random_positions(int64_t rows, int32_t max_position, Rng& rng) {
  if (max_position < 0) throw std::invalid_argument("coda::ref::random_positions: max_position must be >= 0");
  std::uniform_int_distribution<int32_t> start(0, max_position);
  std::uniform_int_distribution<int> restart(0, 15);  // a new packed sequence every ~16 rows on average
  Positions p(static_cast<size_t>(rows));
  int64_t pos = start(rng);
  for (int64_t m = 0; m < rows; ++m) {
    if (m > 0 && (restart(rng) == 0 || pos > max_position)) pos = start(rng);
    p[static_cast<size_t>(m)] = static_cast<int32_t>(pos);
    ++pos;
  }
  return p;
}

Targets random_targets(int64_t rows, int64_t vocab, Rng& rng, double ignore_fraction, int64_t ignore_index) {
  if (vocab <= 0) throw std::invalid_argument("coda::ref::random_targets: vocab must be > 0");
  std::uniform_int_distribution<int64_t> target(0, vocab - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  Targets t(static_cast<size_t>(rows));
  for (int64_t& v : t) {
    v = target(rng);
    if (coin(rng) < ignore_fraction) v = ignore_index;
  }
  return t;
}

Vector rope_inv_freq(int32_t head_dim, double base) {
  if (head_dim < 2 || head_dim % 2 != 0) throw std::invalid_argument("coda::ref::rope_inv_freq: head_dim must be even");
  Vector f(static_cast<size_t>(head_dim / 2));
  for (int32_t i = 0; i < head_dim / 2; ++i) {
    f[static_cast<size_t>(i)] = static_cast<float>(std::pow(base, -2.0 * i / head_dim));
  }
  return f;
}

}  // namespace coda::ref
