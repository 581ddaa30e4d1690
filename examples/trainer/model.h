// The GPT-style decoder, cut for hybrid parallelism: one pipeline stage of a
// tensor-parallel rank. Parameters live in ONE flat fp32 buffer (layout
// below), gradients in a second buffer of the same layout.
//
// Stage p of P holds layers [p * L / P, (p + 1) * L / P); stage 0 also holds
// the token and position embeddings, stage P - 1 the final layer norm and
// the (untied) output head. Tensor parallelism (Megatron-LM): attention heads
// are split over the T ranks of a TP group (qkv weight column-parallel,
// output projection row-parallel), and so is the MLP (fc column-parallel, fc2
// row-parallel). Two allreduces per layer in forward (after the row-parallel
// products) and two in backward (the inputs of the column-parallel products).
// Layer norms, embeddings, the head and the biases of row-parallel products
// are replicated in the TP group and computed redundantly.
//
// Every parameter element is initialised from a hash of (seed, tensor, index
// in the unsplit tensor), so any topology starts from the same model.
//
// Thread safety: none; one thread drives a Stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memento::trainer {

struct ModelConfig {
  int vocab = 64;
  int seq = 16;  // context length T
  int d_model = 32;
  int heads = 4;
  int layers = 2;
  int ffn_mult = 4;

  // Parameters of the whole (unsplit) model.
  int64_t NumParameters() const;
};

struct StageGeometry {
  int tp = 1, tp_rank = 0;
  int pp = 1, pp_rank = 0;
  bool first() const { return pp_rank == 0; }
  bool last() const { return pp_rank == pp - 1; }
};

// One tensor inside the flat parameter buffer.
struct ParamTensor {
  std::string name;        // "h3.qkv_w" (global layer index)
  size_t offset = 0;       // in floats
  size_t numel = 0;        // local elements
  int rows = 0, cols = 0;  // local shape (cols = 0: a vector)
  // Initialisation: kind of value and the map local index -> unsplit index.
  enum class Init { kZero, kOne, kNormal, kNormalScaled } init = Init::kZero;
  uint64_t global_id = 0;
  // Unsplit index of local (r, c): (row_base(r)) * global_cols + col_base + c.
  int global_cols = 0;
  int col_base = 0;
  // Rows: qkv uses three blocks; others one block.
  int row_block = 0;         // local rows per block (0: identity)
  int global_row_block = 0;  // unsplit rows per block
  int row_base = 0;          // offset inside a block
  // Split over the TP group (each TP rank holds a different slice); false
  // for tensors replicated in the TP group.
  bool tp_split = false;

  // Index in the unsplit tensor (row-major) of local element `local`.
  int64_t GlobalIndex(size_t local) const;
};

class Stage {
 public:
  // REQUIRES: heads % tp == 0, d_model % heads == 0, layers % pp == 0.
  Stage(const ModelConfig& config, const StageGeometry& geometry);

  const ModelConfig& config() const { return config_; }
  const StageGeometry& geometry() const { return geometry_; }
  size_t num_params() const { return num_params_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  int first_layer() const { return first_layer_; }
  int num_layers() const { return num_layers_; }

  // Writes the initial values of this stage's parameters into params.
  void InitParameters(float* params, uint64_t seed) const;

  // Allocates activation storage for `slots` micro-batches in flight of
  // `micro_batch` sequences each.
  void Reserve(int slots, int micro_batch);
  int slots() const { return slots_; }
  size_t activation_floats() const { return act_.size(); }

  // Stage input [B, T, d] of a slot (the received activation on a non-first
  // stage) and its output (the activation to send on a non-last stage).
  float* input(int slot);
  float* output(int slot);

  // Forward of one micro-batch in `slot`. tokens: [B, T + 1] (inputs are the
  // first T of each row, targets the last T); used on the first and last
  // stage. On the last stage returns the sum of the token losses, else 0.
  double Forward(int slot, const float* params, const int32_t* tokens);

  // Backward of the micro-batch in `slot`, accumulating into grads. On the
  // last stage `dout` is ignored and the loss gradient uses `loss_scale`;
  // otherwise dout is the gradient of output(slot). On a non-first stage the
  // gradient of input(slot) is written to `dinput`.
  void Backward(int slot, const float* params, float* grads, const float* dout, float* dinput,
                const int32_t* tokens, float loss_scale);

  // Sum-allreduce over the TP group (identity when tp == 1). Set by the
  // owner before Forward/Backward.
  std::function<void(float*, size_t)> tp_allreduce;

 private:
  struct LayerOffsets {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
  };
  // Offsets of one slot's activations of layer l (local index).
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res1, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *res2;
  };

  size_t AddTensor(ParamTensor t);
  LayerActs Acts(int slot, int layer);
  void AllreduceTp(float* data, size_t count);

  ModelConfig config_;
  StageGeometry geometry_;
  int first_layer_ = 0, num_layers_ = 0;
  int cl_ = 0;  // local attention channels (d / tp)
  int fl_ = 0;  // local MLP channels (ffn_mult * d / tp)
  int hl_ = 0;  // local heads
  std::vector<ParamTensor> tensors_;
  size_t num_params_ = 0;
  size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_w_ = 0;
  std::vector<LayerOffsets> layer_;

  int slots_ = 0, micro_batch_ = 0;
  size_t layer_act_floats_ = 0, slot_floats_ = 0;
  std::vector<float> act_;
  // Last-stage per slot: final LN output/mean/rstd and probabilities.
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, probs_, losses_;
  // Scratch shared by all slots (forward logits, backward gradients).
  std::vector<float> logits_, g_res_, g_a_, g_b_, g_c_, g_d_;
};

}  // namespace memento::trainer
