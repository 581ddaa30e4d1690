#include "model.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "data.h"
#include "layers.h"

namespace memento::trainer {

int64_t ModelConfig::NumParameters() const {
  int64_t d = d_model, f = static_cast<int64_t>(ffn_mult) * d_model;
  int64_t per_layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (f * d + f) + (d * f + d);
  return static_cast<int64_t>(vocab) * d * 2 + static_cast<int64_t>(seq) * d + 2 * d +
         per_layer * layers;
}

namespace {

ParamTensor Replicated(std::string name, int rows, int cols, ParamTensor::Init init, uint64_t id) {
  ParamTensor t;
  t.name = std::move(name);
  t.rows = rows;
  t.cols = cols;
  t.numel = static_cast<size_t>(rows) * (cols == 0 ? 1 : cols);
  t.init = init;
  t.global_id = id;
  t.global_cols = cols == 0 ? 1 : cols;
  t.row_block = rows;
  t.global_row_block = rows;
  return t;
}

// Rows [row_base, row_base + row_block) of each block of global_row_block
// rows, all columns.
ParamTensor RowSplit(std::string name, int rows, int cols, int row_block, int global_row_block,
                     int row_base, ParamTensor::Init init, uint64_t id) {
  ParamTensor t = Replicated(std::move(name), rows, cols, init, id);
  t.row_block = row_block;
  t.global_row_block = global_row_block;
  t.row_base = row_base;
  t.tp_split = true;
  return t;
}

// All rows, columns [col_base, col_base + cols) of global_cols.
ParamTensor ColSplit(std::string name, int rows, int cols, int global_cols, int col_base,
                     ParamTensor::Init init, uint64_t id) {
  ParamTensor t = Replicated(std::move(name), rows, cols, init, id);
  t.global_cols = global_cols;
  t.col_base = col_base;
  t.tp_split = true;
  return t;
}

}  // namespace

int64_t ParamTensor::GlobalIndex(size_t local) const {
  const int c = cols == 0 ? 1 : cols;
  const int r = static_cast<int>(local / c), col = static_cast<int>(local % c);
  const int block = r / row_block, rr = r % row_block;
  const int64_t grow = static_cast<int64_t>(block) * global_row_block + row_base + rr;
  return grow * global_cols + col_base + col;
}

Stage::Stage(const ModelConfig& config, const StageGeometry& g) : config_(config), geometry_(g) {
  const int d = config.d_model;
  MEMENTO_CHECK(config.heads % g.tp == 0);
  MEMENTO_CHECK(d % config.heads == 0);
  MEMENTO_CHECK(config.layers % g.pp == 0);
  cl_ = d / g.tp;
  fl_ = config.ffn_mult * d / g.tp;
  hl_ = config.heads / g.tp;
  num_layers_ = config.layers / g.pp;
  first_layer_ = g.pp_rank * num_layers_;
  using I = ParamTensor::Init;
  if (g.first()) {
    wte_ = AddTensor(Replicated("wte", config.vocab, d, I::kNormal, 1));
    wpe_ = AddTensor(Replicated("wpe", config.seq, d, I::kNormal, 2));
  }
  for (int l = 0; l < num_layers_; ++l) {
    const int gl = first_layer_ + l;
    const std::string p = "h" + std::to_string(gl) + ".";
    const uint64_t id = static_cast<uint64_t>(gl + 1) * 16;
    const int tr = g.tp_rank;
    const int f = config.ffn_mult * d;
    LayerOffsets o;
    o.ln1_w = AddTensor(Replicated(p + "ln1_w", d, 0, I::kOne, id + 0));
    o.ln1_b = AddTensor(Replicated(p + "ln1_b", d, 0, I::kZero, id + 1));
    o.qkv_w = AddTensor(RowSplit(p + "qkv_w", 3 * cl_, d, cl_, d, tr * cl_, I::kNormal, id + 2));
    o.qkv_b = AddTensor(RowSplit(p + "qkv_b", 3 * cl_, 0, cl_, d, tr * cl_, I::kZero, id + 3));
    o.proj_w = AddTensor(ColSplit(p + "proj_w", d, cl_, d, tr * cl_, I::kNormalScaled, id + 4));
    o.proj_b = AddTensor(Replicated(p + "proj_b", d, 0, I::kZero, id + 5));
    o.ln2_w = AddTensor(Replicated(p + "ln2_w", d, 0, I::kOne, id + 6));
    o.ln2_b = AddTensor(Replicated(p + "ln2_b", d, 0, I::kZero, id + 7));
    o.fc_w = AddTensor(RowSplit(p + "fc_w", fl_, d, fl_, f, tr * fl_, I::kNormal, id + 8));
    o.fc_b = AddTensor(RowSplit(p + "fc_b", fl_, 0, fl_, f, tr * fl_, I::kZero, id + 9));
    o.fc2_w = AddTensor(ColSplit(p + "fc2_w", d, fl_, f, tr * fl_, I::kNormalScaled, id + 10));
    o.fc2_b = AddTensor(Replicated(p + "fc2_b", d, 0, I::kZero, id + 11));
    layer_.push_back(o);
  }
  if (g.last()) {
    lnf_w_ = AddTensor(Replicated("lnf_w", d, 0, I::kOne, 3));
    lnf_b_ = AddTensor(Replicated("lnf_b", d, 0, I::kZero, 4));
    head_w_ = AddTensor(Replicated("head_w", config.vocab, d, I::kNormal, 5));
  }
}

size_t Stage::AddTensor(ParamTensor t) {
  t.offset = num_params_;
  num_params_ += t.numel;
  tensors_.push_back(t);
  return t.offset;
}

void Stage::InitParameters(float* params, uint64_t seed) const {
  const double std_normal = 0.02;
  const double std_scaled = 0.02 / std::sqrt(2.0 * config_.layers);
  for (const ParamTensor& t : tensors_) {
    float* p = params + t.offset;
    const int cols = t.cols == 0 ? 1 : t.cols;
    for (int r = 0; r < t.rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const int64_t gidx = t.GlobalIndex(static_cast<size_t>(r) * cols + c);
        float value = 0.0f;
        switch (t.init) {
          case ParamTensor::Init::kZero:
            value = 0.0f;
            break;
          case ParamTensor::Init::kOne:
            value = 1.0f;
            break;
          case ParamTensor::Init::kNormal:
          case ParamTensor::Init::kNormalScaled: {
            Rng rng{Mix64(seed ^ Mix64((t.global_id << 40) + static_cast<uint64_t>(gidx)))};
            double s = t.init == ParamTensor::Init::kNormal ? std_normal : std_scaled;
            value = static_cast<float>(s * rng.Normal());
            break;
          }
        }
        p[static_cast<size_t>(r) * cols + c] = value;
      }
    }
  }
}

void Stage::Reserve(int slots, int micro_batch) {
  slots_ = slots;
  micro_batch_ = micro_batch;
  const size_t n = static_cast<size_t>(micro_batch) * config_.seq;
  const size_t d = config_.d_model, t = config_.seq;
  layer_act_floats_ =
      n * d * 4 + n * 4 + n * 3 * cl_ + micro_batch * hl_ * t * t + n * cl_ + n * fl_ * 2;
  slot_floats_ = n * d + layer_act_floats_ * num_layers_;
  act_.assign(slot_floats_ * slots, 0.0f);
  const size_t v = config_.vocab;
  if (geometry_.last()) {
    lnf_.assign(n * d * slots, 0.0f);
    lnf_mean_.assign(n * slots, 0.0f);
    lnf_rstd_.assign(n * slots, 0.0f);
    probs_.assign(n * v * slots, 0.0f);
    losses_.assign(n, 0.0f);
    logits_.assign(n * v, 0.0f);
  }
  g_res_.assign(n * d, 0.0f);
  g_a_.assign(n * fl_, 0.0f);
  g_b_.assign(n * fl_, 0.0f);
  g_c_.assign(n * d, 0.0f);
  g_d_.assign(n * 3 * cl_, 0.0f);
}

float* Stage::input(int slot) { return act_.data() + slot_floats_ * slot; }

float* Stage::output(int slot) { return Acts(slot, num_layers_ - 1).res2; }

Stage::LayerActs Stage::Acts(int slot, int layer) {
  const size_t n = static_cast<size_t>(micro_batch_) * config_.seq;
  const size_t d = config_.d_model, t = config_.seq;
  float* p = input(slot) + n * d + layer_act_floats_ * layer;
  LayerActs a;
  auto take = [&p](size_t count) {
    float* r = p;
    p += count;
    return r;
  };
  a.ln1 = take(n * d);
  a.ln1_mean = take(n);
  a.ln1_rstd = take(n);
  a.qkv = take(n * 3 * cl_);
  a.att = take(micro_batch_ * hl_ * t * t);
  a.atty = take(n * cl_);
  a.res1 = take(n * d);
  a.ln2 = take(n * d);
  a.ln2_mean = take(n);
  a.ln2_rstd = take(n);
  a.fch = take(n * fl_);
  a.fch_gelu = take(n * fl_);
  a.res2 = take(n * d);
  return a;
}

void Stage::AllreduceTp(float* data, size_t count) {
  if (geometry_.tp > 1) tp_allreduce(data, count);
}

namespace {
void SplitTokens(const int32_t* tokens, int b, int t, std::vector<int32_t>* inputs,
                 std::vector<int32_t>* targets) {
  inputs->resize(static_cast<size_t>(b) * t);
  targets->resize(static_cast<size_t>(b) * t);
  for (int i = 0; i < b; ++i) {
    for (int j = 0; j < t; ++j) {
      (*inputs)[i * t + j] = tokens[i * (t + 1) + j];
      (*targets)[i * t + j] = tokens[i * (t + 1) + j + 1];
    }
  }
}
}  // namespace

double Stage::Forward(int slot, const float* params, const int32_t* tokens) {
  const int b = micro_batch_, t = config_.seq, d = config_.d_model, v = config_.vocab;
  const int n = b * t;
  std::vector<int32_t> inputs, targets;
  if (geometry_.first() || geometry_.last()) SplitTokens(tokens, b, t, &inputs, &targets);
  float* x = input(slot);
  if (geometry_.first()) {
    EmbeddingForward(x, inputs.data(), params + wte_, params + wpe_, b, t, d);
  }
  for (int l = 0; l < num_layers_; ++l) {
    const LayerOffsets& o = layer_[l];
    LayerActs a = Acts(slot, l);
    LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, params + o.ln1_w, params + o.ln1_b, n, d);
    LinearForward(a.qkv, a.ln1, params + o.qkv_w, params + o.qkv_b, n, d, 3 * cl_);
    AttentionForward(a.atty, a.att, a.qkv, b, t, cl_, hl_);
    LinearForward(a.res1, a.atty, params + o.proj_w, nullptr, n, cl_, d);
    AllreduceTp(a.res1, static_cast<size_t>(n) * d);
    const float* pb = params + o.proj_b;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < d; ++j) a.res1[i * d + j] = x[i * d + j] + (a.res1[i * d + j] + pb[j]);
    }
    LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, params + o.ln2_w, params + o.ln2_b, n,
                     d);
    LinearForward(a.fch, a.ln2, params + o.fc_w, params + o.fc_b, n, d, fl_);
    GeluForward(a.fch_gelu, a.fch, static_cast<size_t>(n) * fl_);
    LinearForward(a.res2, a.fch_gelu, params + o.fc2_w, nullptr, n, fl_, d);
    AllreduceTp(a.res2, static_cast<size_t>(n) * d);
    const float* fb = params + o.fc2_b;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < d; ++j) {
        a.res2[i * d + j] = a.res1[i * d + j] + (a.res2[i * d + j] + fb[j]);
      }
    }
    x = a.res2;
  }
  if (!geometry_.last()) return 0.0;
  float* lnf = lnf_.data() + static_cast<size_t>(slot) * n * d;
  float* mean = lnf_mean_.data() + static_cast<size_t>(slot) * n;
  float* rstd = lnf_rstd_.data() + static_cast<size_t>(slot) * n;
  float* probs = probs_.data() + static_cast<size_t>(slot) * n * v;
  LayerNormForward(lnf, mean, rstd, x, params + lnf_w_, params + lnf_b_, n, d);
  LinearForward(logits_.data(), lnf, params + head_w_, nullptr, n, d, v);
  CrossEntropyForward(losses_.data(), probs, logits_.data(), targets.data(), n, v);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += losses_[i];
  return sum;
}

void Stage::Backward(int slot, const float* params, float* grads, const float* dout, float* dinput,
                     const int32_t* tokens, float loss_scale) {
  const int b = micro_batch_, t = config_.seq, d = config_.d_model, v = config_.vocab;
  const int n = b * t;
  const size_t nd = static_cast<size_t>(n) * d;
  std::vector<int32_t> inputs, targets;
  if (geometry_.first() || geometry_.last()) SplitTokens(tokens, b, t, &inputs, &targets);
  float* g_res = g_res_.data();
  if (geometry_.last()) {
    const float* lnf = lnf_.data() + static_cast<size_t>(slot) * nd;
    const float* mean = lnf_mean_.data() + static_cast<size_t>(slot) * n;
    const float* rstd = lnf_rstd_.data() + static_cast<size_t>(slot) * n;
    const float* probs = probs_.data() + static_cast<size_t>(slot) * n * v;
    CrossEntropyBackward(logits_.data(), probs, targets.data(), loss_scale, n, v);
    std::memset(g_c_.data(), 0, nd * sizeof(float));
    LinearBackward(g_c_.data(), grads + head_w_, nullptr, logits_.data(), lnf, params + head_w_, n,
                   d, v);
    std::memset(g_res, 0, nd * sizeof(float));
    LayerNormBackward(g_res, grads + lnf_w_, grads + lnf_b_, g_c_.data(), output(slot),
                      params + lnf_w_, mean, rstd, n, d);
  } else {
    std::memcpy(g_res, dout, nd * sizeof(float));
  }
  for (int l = num_layers_ - 1; l >= 0; --l) {
    const LayerOffsets& o = layer_[l];
    LayerActs a = Acts(slot, l);
    const float* x = l == 0 ? input(slot) : Acts(slot, l - 1).res2;
    const size_t nf = static_cast<size_t>(n) * fl_;
    // MLP.
    std::memset(g_a_.data(), 0, nf * sizeof(float));
    LinearBackward(g_a_.data(), grads + o.fc2_w, grads + o.fc2_b, g_res, a.fch_gelu,
                   params + o.fc2_w, n, fl_, d);
    std::memset(g_b_.data(), 0, nf * sizeof(float));
    GeluBackward(g_b_.data(), a.fch, g_a_.data(), nf);
    std::memset(g_c_.data(), 0, nd * sizeof(float));
    LinearBackward(g_c_.data(), grads + o.fc_w, grads + o.fc_b, g_b_.data(), a.ln2, params + o.fc_w,
                   n, d, fl_);
    AllreduceTp(g_c_.data(), nd);
    LayerNormBackward(g_res, grads + o.ln2_w, grads + o.ln2_b, g_c_.data(), a.res1,
                      params + o.ln2_w, a.ln2_mean, a.ln2_rstd, n, d);
    // Attention.
    const size_t nc = static_cast<size_t>(n) * cl_;
    std::memset(g_a_.data(), 0, nc * sizeof(float));
    LinearBackward(g_a_.data(), grads + o.proj_w, grads + o.proj_b, g_res, a.atty,
                   params + o.proj_w, n, cl_, d);
    std::memset(g_d_.data(), 0, 3 * nc * sizeof(float));
    AttentionBackward(g_d_.data(), g_a_.data(), a.qkv, a.att, b, t, cl_, hl_);
    std::memset(g_c_.data(), 0, nd * sizeof(float));
    LinearBackward(g_c_.data(), grads + o.qkv_w, grads + o.qkv_b, g_d_.data(), a.ln1,
                   params + o.qkv_w, n, d, 3 * cl_);
    AllreduceTp(g_c_.data(), nd);
    LayerNormBackward(g_res, grads + o.ln1_w, grads + o.ln1_b, g_c_.data(), x, params + o.ln1_w,
                      a.ln1_mean, a.ln1_rstd, n, d);
  }
  if (geometry_.first()) {
    EmbeddingBackward(grads + wte_, grads + wpe_, g_res, inputs.data(), b, t, d);
  } else {
    std::memcpy(dinput, g_res, nd * sizeof(float));
  }
}

}  // namespace memento::trainer
