#include "layers.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace memento::trainer {

void LinearForward(float* out, const float* inp, const float* w, const float* bias, int n, int c,
                   int oc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, c, 1.0f, inp, c, w, c, 0.0f, out, oc);
  if (bias != nullptr) {
    for (int i = 0; i < n; ++i) {
      float* row = out + static_cast<size_t>(i) * oc;
      for (int o = 0; o < oc; ++o) row[o] += bias[o];
    }
  }
}

void LinearBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                    const float* w, int n, int c, int oc) {
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, c, oc, 1.0f, dout, oc, w, c, 1.0f,
                dinp, c);
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, c, n, 1.0f, dout, oc, inp, c, 1.0f, dw,
                c);
  }
  if (dbias != nullptr) {
    for (int i = 0; i < n; ++i) {
      const float* row = dout + static_cast<size_t>(i) * oc;
      for (int o = 0; o < oc; ++o) dbias[o] += row[o];
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                      const float* b, int n, int c) {
  const float eps = 1e-5f;
  for (int i = 0; i < n; ++i) {
    const float* x = inp + static_cast<size_t>(i) * c;
    float m = 0.0f;
    for (int j = 0; j < c; ++j) m += x[j];
    m /= c;
    float v = 0.0f;
    for (int j = 0; j < c; ++j) {
      float d = x[j] - m;
      v += d * d;
    }
    v /= c;
    float s = 1.0f / std::sqrt(v + eps);
    float* y = out + static_cast<size_t>(i) * c;
    for (int j = 0; j < c; ++j) y[j] = (x[j] - m) * s * w[j] + b[j];
    mean[i] = m;
    rstd[i] = s;
  }
}

void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, const float* mean, const float* rstd, int n, int c) {
  for (int i = 0; i < n; ++i) {
    const float* dy = dout + static_cast<size_t>(i) * c;
    const float* x = inp + static_cast<size_t>(i) * c;
    float* dx = dinp + static_cast<size_t>(i) * c;
    float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int j = 0; j < c; ++j) {
      float norm = (x[j] - m) * s;
      float dnorm = w[j] * dy[j];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= c;
    dnorm_norm_mean /= c;
    for (int j = 0; j < c; ++j) {
      float norm = (x[j] - m) * s;
      float dnorm = w[j] * dy[j];
      if (db != nullptr) db[j] += dy[j];
      if (dw != nullptr) dw[j] += norm * dy[j];
      dx[j] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}

void GeluForward(float* out, const float* inp, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float arg = kGeluScale * (x + cube);
    float th = std::tanh(arg);
    float ch = std::cosh(arg);
    float sech2 = 1.0f / (ch * ch);
    float grad =
        0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

void AttentionForward(float* out, float* att, const float* qkv, int b, int t, int c, int heads) {
  const int hs = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t c3 = static_cast<size_t>(c) * 3;
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      for (int h = 0; h < heads; ++h) {
        const float* q = qkv + (static_cast<size_t>(bi) * t + ti) * c3 + h * hs;
        float* a = att + ((static_cast<size_t>(bi) * heads + h) * t + ti) * t;
        float maxv = -1e30f;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const float* k = qkv + (static_cast<size_t>(bi) * t + t2) * c3 + c + h * hs;
          float dot = 0.0f;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[t2] = dot;
          if (dot > maxv) maxv = dot;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= ti; ++t2) {
          float e = std::exp(a[t2] - maxv);
          a[t2] = e;
          sum += e;
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 < t; ++t2) a[t2] = t2 <= ti ? a[t2] * inv : 0.0f;
        float* o = out + (static_cast<size_t>(bi) * t + ti) * c + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const float* v = qkv + (static_cast<size_t>(bi) * t + t2) * c3 + 2 * c + h * hs;
          float p = a[t2];
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int b,
                       int t, int c, int heads) {
  const int hs = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t c3 = static_cast<size_t>(c) * 3;
  std::vector<float> datt(t), dpre(t);
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      for (int h = 0; h < heads; ++h) {
        const size_t row = (static_cast<size_t>(bi) * t + ti) * c3;
        const float* q = qkv + row + h * hs;
        float* dq = dqkv + row + h * hs;
        const float* a = att + ((static_cast<size_t>(bi) * heads + h) * t + ti) * t;
        const float* dy = dout + (static_cast<size_t>(bi) * t + ti) * c + h * hs;
        // Through out = sum att * v.
        for (int t2 = 0; t2 <= ti; ++t2) {
          const size_t row2 = (static_cast<size_t>(bi) * t + t2) * c3;
          const float* v = qkv + row2 + 2 * c + h * hs;
          float* dv = dqkv + row2 + 2 * c + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; ++i) {
            s += v[i] * dy[i];
            dv[i] += a[t2] * dy[i];
          }
          datt[t2] = s;
        }
        // Through the softmax.
        float dot = 0.0f;
        for (int t2 = 0; t2 <= ti; ++t2) dot += a[t2] * datt[t2];
        for (int t2 = 0; t2 <= ti; ++t2) dpre[t2] = a[t2] * (datt[t2] - dot) * scale;
        // Through q . k.
        for (int t2 = 0; t2 <= ti; ++t2) {
          const size_t row2 = (static_cast<size_t>(bi) * t + t2) * c3;
          const float* k = qkv + row2 + c + h * hs;
          float* dk = dqkv + row2 + c + h * hs;
          float g = dpre[t2];
          for (int i = 0; i < hs; ++i) {
            dq[i] += k[i] * g;
            dk[i] += q[i] * g;
          }
        }
      }
    }
  }
}

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int b,
                      int t, int c) {
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      float* o = out + (static_cast<size_t>(bi) * t + ti) * c;
      const float* e = wte + static_cast<size_t>(tokens[bi * t + ti]) * c;
      const float* p = wpe + static_cast<size_t>(ti) * c;
      for (int i = 0; i < c; ++i) o[i] = e[i] + p[i];
    }
  }
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int b,
                       int t, int c) {
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      const float* d = dout + (static_cast<size_t>(bi) * t + ti) * c;
      float* de = dwte + static_cast<size_t>(tokens[bi * t + ti]) * c;
      float* dp = dwpe + static_cast<size_t>(ti) * c;
      for (int i = 0; i < c; ++i) {
        de[i] += d[i];
        dp[i] += d[i];
      }
    }
  }
}

void CrossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets,
                         int n, int v) {
  for (int i = 0; i < n; ++i) {
    const float* x = logits + static_cast<size_t>(i) * v;
    float* p = probs + static_cast<size_t>(i) * v;
    float maxv = x[0];
    for (int j = 1; j < v; ++j) maxv = x[j] > maxv ? x[j] : maxv;
    float sum = 0.0f;
    for (int j = 0; j < v; ++j) {
      p[j] = std::exp(x[j] - maxv);
      sum += p[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < v; ++j) p[j] *= inv;
    // log-sum-exp form: more accurate than -log(p) for tiny probabilities.
    losses[i] = std::log(sum) + maxv - x[targets[i]];
  }
}

void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets, float scale,
                          int n, int v) {
  for (int i = 0; i < n; ++i) {
    const float* p = probs + static_cast<size_t>(i) * v;
    float* d = dlogits + static_cast<size_t>(i) * v;
    for (int j = 0; j < v; ++j) d[j] = p[j] * scale;
    d[targets[i]] -= scale;
  }
}

void Add(float* out, const float* a, const float* b, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void Accumulate(float* out, const float* a, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] += a[i];
}

}  // namespace memento::trainer
