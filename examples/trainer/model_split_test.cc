// The Megatron tensor split and the pipeline split give the gradients of the
// unsplit model: every TP slice of every parameter gradient is compared,
// element by element through ParamTensor::GlobalIndex, with the gradient of
// the one-rank model, and so is every stage's gradient of a PP split. TP
// ranks run as threads with an in-process allreduce (no sockets), so this
// checks the model code alone.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data.h"
#include "model.h"

namespace memento::trainer {
namespace {

// Sum-allreduce among `size` threads.
class LocalAllreduce {
 public:
  explicit LocalAllreduce(int size) : size_(size), ptrs_(size) {}
  void Run(int rank, float* data, size_t count) {
    ptrs_[rank] = data;
    Barrier();
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < size_; ++r) {
      for (size_t i = 0; i < count; ++i) sum[i] += ptrs_[r][i];
    }
    Barrier();
    std::copy(sum.begin(), sum.end(), data);
  }

 private:
  void Barrier() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return generation_ != gen; });
    }
  }
  int size_;
  std::vector<float*> ptrs_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

ModelConfig Config() {
  ModelConfig c;
  c.vocab = 13;
  c.seq = 5;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 2;
  return c;
}

struct Reference {
  std::vector<float> params, grads;
  std::map<std::string, ParamTensor> tensors;
  double loss = 0;
};

constexpr int kBatch = 3;

std::vector<int32_t> Tokens(const ModelConfig& c) {
  MarkovCorpus corpus(c.vocab, 5);
  DataCursor cursor = InitialCursor(5);
  std::vector<int32_t> tokens(kBatch * (c.seq + 1));
  corpus.NextBatch(&cursor, kBatch, 0, kBatch, c.seq, tokens.data());
  return tokens;
}

Reference RunReference(const ModelConfig& c, const std::vector<int32_t>& tokens) {
  Stage stage(c, StageGeometry{});
  stage.Reserve(1, kBatch);
  Reference ref;
  ref.params.resize(stage.num_params());
  ref.grads.assign(stage.num_params(), 0.0f);
  stage.InitParameters(ref.params.data(), 11);
  ref.loss = stage.Forward(0, ref.params.data(), tokens.data());
  stage.Backward(0, ref.params.data(), ref.grads.data(), nullptr, nullptr, tokens.data(), 1.0f);
  for (const ParamTensor& t : stage.tensors()) ref.tensors[t.name] = t;
  return ref;
}

// Compares a split stage's gradient with the reference, tensor by tensor.
void ExpectSameGradients(const Stage& stage, const std::vector<float>& grads, const Reference& ref,
                         const std::string& what) {
  for (const ParamTensor& t : stage.tensors()) {
    auto it = ref.tensors.find(t.name);
    ASSERT_NE(it, ref.tensors.end()) << t.name;
    int bad = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      const float want = ref.grads[it->second.offset + t.GlobalIndex(i)];
      const float got = grads[t.offset + i];
      if (std::fabs(got - want) > 1e-5f + 1e-4f * std::fabs(want) && ++bad <= 3) {
        ADD_FAILURE() << what << " " << t.name << "[" << i << "]: " << got << " vs " << want;
      }
    }
  }
}

TEST(ModelSplitTest, TensorParallelGradientsAreSlicesOfTheWhole) {
  const ModelConfig c = Config();
  const std::vector<int32_t> tokens = Tokens(c);
  const Reference ref = RunReference(c, tokens);
  for (int tp : {2, 4}) {
    LocalAllreduce allreduce(tp);
    std::vector<std::unique_ptr<Stage>> stages;
    std::vector<std::vector<float>> params(tp), grads(tp);
    std::vector<double> losses(tp);
    for (int r = 0; r < tp; ++r) {
      StageGeometry g;
      g.tp = tp;
      g.tp_rank = r;
      stages.push_back(std::make_unique<Stage>(c, g));
      stages[r]->Reserve(1, kBatch);
      stages[r]->tp_allreduce = [&allreduce, r](float* d, size_t n) { allreduce.Run(r, d, n); };
      params[r].resize(stages[r]->num_params());
      grads[r].assign(stages[r]->num_params(), 0.0f);
      stages[r]->InitParameters(params[r].data(), 11);
      // Initial values are the slices of the unsplit model's.
      for (const ParamTensor& t : stages[r]->tensors()) {
        const ParamTensor& whole = ref.tensors.at(t.name);
        for (size_t i = 0; i < t.numel; ++i) {
          ASSERT_EQ(params[r][t.offset + i], ref.params[whole.offset + t.GlobalIndex(i)]);
        }
      }
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        losses[r] = stages[r]->Forward(0, params[r].data(), tokens.data());
        stages[r]->Backward(0, params[r].data(), grads[r].data(), nullptr, nullptr, tokens.data(),
                            1.0f);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < tp; ++r) {
      EXPECT_NEAR(losses[r], ref.loss, 1e-4 * ref.loss);
      ExpectSameGradients(*stages[r], grads[r], ref, "tp" + std::to_string(tp));
    }
  }
}

TEST(ModelSplitTest, PipelineStagesComposeToTheWhole) {
  const ModelConfig c = Config();
  const std::vector<int32_t> tokens = Tokens(c);
  const Reference ref = RunReference(c, tokens);
  const int pp = 2;
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::vector<float>> params(pp), grads(pp);
  for (int s = 0; s < pp; ++s) {
    StageGeometry g;
    g.pp = pp;
    g.pp_rank = s;
    stages.push_back(std::make_unique<Stage>(c, g));
    stages[s]->Reserve(1, kBatch);
    params[s].resize(stages[s]->num_params());
    grads[s].assign(stages[s]->num_params(), 0.0f);
    stages[s]->InitParameters(params[s].data(), 11);
  }
  const size_t act = static_cast<size_t>(kBatch) * c.seq * c.d_model;
  EXPECT_EQ(stages[0]->Forward(0, params[0].data(), tokens.data()), 0.0);
  std::copy(stages[0]->output(0), stages[0]->output(0) + act, stages[1]->input(0));
  const double loss = stages[1]->Forward(0, params[1].data(), tokens.data());
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
  std::vector<float> dinput(act);
  stages[1]->Backward(0, params[1].data(), grads[1].data(), nullptr, dinput.data(), tokens.data(),
                      1.0f);
  stages[0]->Backward(0, params[0].data(), grads[0].data(), dinput.data(), nullptr, tokens.data(),
                      1.0f);
  size_t total = 0;
  for (int s = 0; s < pp; ++s) {
    ExpectSameGradients(*stages[s], grads[s], ref, "pp stage " + std::to_string(s));
    total += stages[s]->num_params();
  }
  EXPECT_EQ(total, ref.params.size());  // the stages partition the model
}

}  // namespace
}  // namespace memento::trainer
