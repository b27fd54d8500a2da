// Log-sum-exp and cross-entropy in float64: the online (max, sumexp) states and their merge, linear_rowscale_lse's
// blocked log-sum-exp over N-tiles, linear_rowscale_lse (LM head lse and target logit) and cross_entropy (loss,
// reductions, label smoothing, z-loss, softcap, ignore_index, dlogits and zdz).
#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace coda::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("coda::ref: ") + what);
}

size_t idx(int64_t i) { return static_cast<size_t>(i); }

void check_targets(const Targets& targets, int64_t rows, int64_t vocab, int64_t ignore_index, const char* where) {
  if (static_cast<int64_t>(targets.size()) != rows) {
    throw std::invalid_argument(std::string("coda::ref::") + where + ": targets must be [M]");
  }
  for (int64_t t : targets) {
    if (t != ignore_index && (t < 0 || t >= vocab)) {
      throw std::invalid_argument(std::string("coda::ref::") + where + ": target outside [0,V) and not ignore_index");
    }
  }
}

}  // namespace

// ---- online log-sum-exp states -----------------------------------------------------------------------------------

LseState lse_empty() { return LseState{kNegInf, 0.0}; }

LseState lse_update(LseState s, double v) {
  if (v == kNegInf) return s;
  const double mx = std::max(s.mx, v);
  // With s empty, exp(-inf - mx) = 0: the formula needs no special case.
  return LseState{mx, s.se * std::exp(s.mx - mx) + std::exp(v - mx)};
}

LseState lse_merge(LseState a, LseState b) {
  if (a.mx == kNegInf) return b;  // also avoids -inf - -inf = NaN when both are empty
  if (b.mx == kNegInf) return a;
  const double mx = std::max(a.mx, b.mx);
  return LseState{mx, a.se * std::exp(a.mx - mx) + b.se * std::exp(b.mx - mx)};
}

double lse_value(LseState s) { return s.mx == kNegInf ? kNegInf : s.mx + std::log(s.se); }

double softcap(double l, double c) { return c > 0 ? c * std::tanh(l / c) : l; }

Matrix softcap(const Matrix& l, double c) {
  Matrix out = l;
  for (double& v : out.data) v = softcap(v, c);
  return out;
}

Vector logsumexp_rows(const Matrix& l) {
  Vector out(idx(l.rows));
  for (int64_t m = 0; m < l.rows; ++m) {
    double mx = kNegInf;
    for (int64_t j = 0; j < l.cols; ++j) mx = std::max(mx, l(m, j));
    double se = 0;
    for (int64_t j = 0; j < l.cols; ++j) se += std::exp(l(m, j) - mx);
    out[idx(m)] = mx + std::log(se);
  }
  return out;
}

BlockedLse blocked_lse(const Matrix& logits, int64_t tile_n, double softcap_value, int lanes) {
  require(tile_n > 0 && lanes > 0, "blocked_lse: tile_n and lanes must be > 0");
  require(softcap_value >= 0, "blocked_lse: softcap must be >= 0");
  const int64_t vocab = logits.cols;
  const int64_t tiles = (vocab + tile_n - 1) / tile_n;
  BlockedLse out{Matrix(tiles, logits.rows), Matrix(tiles, logits.rows), Matrix(tiles, logits.rows),
                 Vector(idx(logits.rows))};
  std::vector<LseState> lane(idx(lanes));
  for (int64_t m = 0; m < logits.rows; ++m) {
    for (int64_t t = 0; t < tiles; ++t) {
      // Each lane walks its strided columns of the tile; overhang columns (>= V) are skipped, never entered.
      for (int k = 0; k < lanes; ++k) {
        LseState s = lse_empty();
        for (int64_t j = t * tile_n + k; j < (t + 1) * tile_n; j += lanes) {
          if (j < vocab) s = lse_update(s, softcap(logits(m, j), softcap_value));
        }
        lane[idx(k)] = s;
      }
      // Tree merge across lanes (as a shuffle reduction would): lane k takes lane k + stride.
      for (int stride = 1; stride < lanes; stride *= 2) {
        for (int k = 0; k + stride < lanes; k += 2 * stride) {
          lane[idx(k)] = lse_merge(lane[idx(k)], lane[idx(k + stride)]);
        }
      }
      out.tile_max(t, m) = lane[0].mx;
      out.tile_sumexp(t, m) = lane[0].se;
      out.tile_lse(t, m) = lse_value(lane[0]);
    }
    // Final reduce: lse = logsumexp over the tile results.
    double mx = kNegInf;
    for (int64_t t = 0; t < tiles; ++t) mx = std::max(mx, out.tile_lse(t, m));
    double se = 0;
    for (int64_t t = 0; t < tiles; ++t) se += std::exp(out.tile_lse(t, m) - mx);
    out.lse[idx(m)] = mx + std::log(se);
  }
  return out;
}

// ---- linear_rowscale_lse -----------------------------------------------------------------------------------------

Lse logits_lse(const Matrix& logits, const Targets& targets, double softcap_value, int64_t ignore_index) {
  require(softcap_value >= 0, "logits_lse: softcap must be >= 0");
  check_targets(targets, logits.rows, logits.cols, ignore_index, "logits_lse");
  Lse out;
  out.logits = logits;
  out.capped = softcap(logits, softcap_value);
  out.lse = logsumexp_rows(out.capped);
  out.target_logit.assign(idx(logits.rows), 0.0);
  for (int64_t m = 0; m < logits.rows; ++m) {
    const int64_t t = targets[idx(m)];
    if (t != ignore_index) out.target_logit[idx(m)] = out.capped(m, t);
  }
  return out;
}

Lse linear_rowscale_lse(const Matrix& h, const Matrix& w, const Vector& rstd, const Targets& targets,
                        double softcap_value, int64_t ignore_index) {
  return logits_lse(linear_rowscale(h, w, rstd), targets, softcap_value, ignore_index);
}

// ---- cross_entropy -----------------------------------------------------------------------------------------------

coda_ce_options default_ce_options() {
  coda_ce_options o{};
  o.ignore_index = -100;
  o.reduction = CODA_REDUCTION_MEAN;
  o.label_smoothing = 0.0f;
  o.z_loss = 0.0f;
  o.softcap = 0.0f;
  return o;
}

CrossEntropy cross_entropy(const Matrix& logits, const Targets& targets, const coda_ce_options& options,
                           const Vector& grad_loss, int64_t hidden_size) {
  const int64_t rows = logits.rows;
  const int64_t vocab = logits.cols;
  require(vocab > 0, "cross_entropy: V must be > 0");
  require(options.reduction == CODA_REDUCTION_NONE || options.reduction == CODA_REDUCTION_MEAN ||
              options.reduction == CODA_REDUCTION_SUM,
          "cross_entropy: bad reduction");
  require(options.label_smoothing >= 0 && options.label_smoothing <= 1, "cross_entropy: label_smoothing in [0,1]");
  require(options.z_loss >= 0 && options.softcap >= 0, "cross_entropy: z_loss and softcap must be >= 0");
  require(hidden_size > 0, "cross_entropy: hidden_size must be > 0");
  require(grad_loss.size() <= 1 || (options.reduction == CODA_REDUCTION_NONE &&
                                    static_cast<int64_t>(grad_loss.size()) == rows),
          "cross_entropy: grad_loss must be empty, [1], or [M] with reduction none");
  check_targets(targets, rows, vocab, options.ignore_index, "cross_entropy");

  const double ls = options.label_smoothing;
  const double zl = options.z_loss;
  const double cap = options.softcap;
  const double upstream = grad_loss.size() == 1 ? grad_loss[0] : 1.0;

  CrossEntropy out;
  out.loss_rows.assign(idx(rows), 0.0);
  out.dlogits = Matrix(rows, vocab);
  out.zdz.assign(idx(rows), 0.0);
  out.grad_scale.assign(idx(rows), 0.0);
  out.lse = logsumexp_rows(softcap(logits, cap));
  for (int64_t t : targets) out.n_valid += t != options.ignore_index ? 1 : 0;

  for (int64_t m = 0; m < rows; ++m) {
    const int64_t t = targets[idx(m)];
    if (t == options.ignore_index) continue;  // loss 0, gradient 0, zdz 0
    const double lse = out.lse[idx(m)];
    double sum_capped = 0;
    for (int64_t j = 0; j < vocab; ++j) sum_capped += softcap(logits(m, j), cap);
    const double l_t = softcap(logits(m, t), cap);
    out.loss_rows[idx(m)] =
        (1 - ls) * (lse - l_t) + ls * (lse - sum_capped / static_cast<double>(vocab)) + zl * lse * lse;

    double g = upstream;
    if (options.reduction == CODA_REDUCTION_MEAN) g = upstream / static_cast<double>(out.n_valid);
    if (grad_loss.size() > 1) g = grad_loss[idx(m)];
    out.grad_scale[idx(m)] = g;

    double s_zdz = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double l_raw = logits(m, j);
      const double p = std::exp(softcap(l_raw, cap) - lse);
      double dl = g * (p - (j == t ? 1 - ls : 0.0) - ls / static_cast<double>(vocab) + 2 * zl * lse * p);
      if (cap > 0) {
        const double th = std::tanh(l_raw / cap);
        dl *= 1 - th * th;
      }
      out.dlogits(m, j) = dl;
      s_zdz += l_raw * dl;
    }
    out.zdz[idx(m)] = s_zdz / static_cast<double>(hidden_size);
  }

  double total = 0;
  for (double v : out.loss_rows) total += v;
  switch (options.reduction) {
    case CODA_REDUCTION_NONE:
      out.loss = out.loss_rows;
      break;
    case CODA_REDUCTION_MEAN:
      out.loss = {out.n_valid > 0 ? total / static_cast<double>(out.n_valid) : 0.0};
      break;
    case CODA_REDUCTION_SUM:
      out.loss = {total};
      break;
  }
  return out;
}

}  // namespace coda::ref
