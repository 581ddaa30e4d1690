// Hand-written forward and backward passes of the GPT layers (in the spirit of
// llm.c), fp32, matrix products through BLAS (cblas_sgemm).
//
// Layout conventions: activations are row-major [N, C] with N = B * T rows;
// a linear layer's weight is [OC, C] (out x in) and computes y = x W^T + b.
// Every backward function ACCUMULATES (+=) into its gradient outputs, so the
// caller zeroes gradients once per step and micro-batches add up.
//
// All functions are deterministic: the same inputs give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memento::trainer {

// out[N, OC] = inp[N, C] * w[OC, C]^T + bias[OC] (bias may be null).
void LinearForward(float* out, const float* inp, const float* w, const float* bias, int n, int c,
                   int oc);
// dinp += dout * w; dw += dout^T * inp; dbias += column sums of dout. Any of
// dinp, dw, dbias may be null (not needed).
void LinearBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                    const float* w, int n, int c, int oc);

// out[n] = (x[n] - mean) * rstd * w + b over the C channels of each row; saves
// mean[N] and rstd[N] for the backward pass.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                      const float* b, int n, int c);
void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, const float* mean, const float* rstd, int n, int c);

// GELU, tanh approximation (GPT-2).
void GeluForward(float* out, const float* inp, size_t count);
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t count);

// Causal multi-head self-attention on packed qkv[B, T, 3 * C] (q | k | v, each
// [heads, head_size]); writes out[B, T, C] and keeps the softmax
// probabilities att[B, heads, T, T] for the backward pass.
void AttentionForward(float* out, float* att, const float* qkv, int b, int t, int c, int heads);
// dqkv += gradient.
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int b,
                       int t, int c, int heads);

// out[b, t] = wte[tokens[b, t]] + wpe[t].
void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int b,
                      int t, int c);
void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int b,
                       int t, int c);

// Softmax cross-entropy over logits[N, V]: losses[n] = -log p(targets[n]),
// probs[N, V] kept. Backward writes (not accumulates) dlogits = (probs -
// onehot) * scale (scale = 1 / number of tokens in the global batch).
void CrossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets,
                         int n, int v);
void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets, float scale,
                          int n, int v);

// out = a + b (count elements); a and out may alias.
void Add(float* out, const float* a, const float* b, size_t count);
// out += a.
void Accumulate(float* out, const float* a, size_t count);

}  // namespace memento::trainer
