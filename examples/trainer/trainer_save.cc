// The trainer's own saved state (--save, --load, --save-every): one file per
// rank, a fixed raw header, then the parameters, the optimizer moments and
// the TrainState (Trainer::Save, Load, SavedStep; docs/trainer.md). Moved
// out of trainer.cc unchanged.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"
#include "common/clock.h"
#include "trainer.h"

namespace memento::trainer {

namespace {

// Header of a saved rank state; fixed layout, written raw.
struct SaveHeader {
  char magic[8];
  uint32_t version;
  int32_t rank;
  int32_t dp, tp, pp, zero1;
  int32_t vocab, seq, d_model, heads, layers, ffn_mult;
  uint64_t padded_params;
  uint64_t optimizer_numel;
  uint64_t optimizer_offset;
};
static_assert(sizeof(SaveHeader) == 80, "SaveHeader is saved raw");
constexpr char kSaveMagic[8] = {'M', 'M', 'T', 'R', 'A', 'I', 'N', '1'};

}  // namespace

namespace {
SaveHeader MakeHeader(const TrainerOptions& o, size_t padded, size_t opt, size_t offset) {
  SaveHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kSaveMagic, sizeof(h.magic));
  h.version = 1;
  h.rank = o.comm.rank;
  h.dp = o.comm.topology.dp;
  h.tp = o.comm.topology.tp;
  h.pp = o.comm.topology.pp;
  h.zero1 = o.zero1 ? 1 : 0;
  h.vocab = o.model.vocab;
  h.seq = o.model.seq;
  h.d_model = o.model.d_model;
  h.heads = o.model.heads;
  h.layers = o.model.layers;
  h.ffn_mult = o.model.ffn_mult;
  h.padded_params = padded;
  h.optimizer_numel = opt;
  h.optimizer_offset = offset;
  return h;
}
}  // namespace

Status Trainer::Save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoError("open " + tmp, errno);
  SaveHeader h = MakeHeader(options_, params_.size(), m_.size(), opt_offset_);
  bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1 &&
            std::fwrite(params_.data(), sizeof(float), params_.size(), f) == params_.size() &&
            std::fwrite(m_.data(), sizeof(float), m_.size(), f) == m_.size() &&
            std::fwrite(v_.data(), sizeof(float), v_.size(), f) == v_.size() &&
            std::fwrite(&state_, sizeof(state_), 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return ErrnoError("write " + tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  return Status::Ok();
}

// Opens a file written by Save and checks its header against this rank's
// (model, topology, rank, sizes); `*f` is positioned after the header.
Status Trainer::OpenSaved(const std::string& path, FILE** f) const {
  *f = std::fopen(path.c_str(), "rb");
  if (*f == nullptr) return ErrnoError("open " + path, errno);
  SaveHeader h, want = MakeHeader(options_, params_.size(), m_.size(), opt_offset_);
  if (std::fread(&h, sizeof(h), 1, *f) != 1) {
    std::fclose(*f);
    *f = nullptr;
    return DataLossError(path + ": truncated");
  }
  if (std::memcmp(&h, &want, sizeof(h)) != 0) {
    std::fclose(*f);
    *f = nullptr;
    return InvalidArgumentError(
        path + ": saved by another model, topology or rank (header mismatch: rank " +
        std::to_string(h.rank) + " dp " + std::to_string(h.dp) + " tp " + std::to_string(h.tp) +
        " pp " + std::to_string(h.pp) + " params " + std::to_string(h.padded_params) +
        "; this rank " + std::to_string(want.rank) + " dp " + std::to_string(want.dp) + " tp " +
        std::to_string(want.tp) + " pp " + std::to_string(want.pp) + " params " +
        std::to_string(want.padded_params) + ")");
  }
  return Status::Ok();
}

Status Trainer::Load(const std::string& path) {
  FILE* f = nullptr;
  MEMENTO_RETURN_IF_ERROR(OpenSaved(path, &f));
  std::vector<float> params(params_.size()), m(m_.size()), v(v_.size());
  TrainState state;
  bool ok = std::fread(params.data(), sizeof(float), params.size(), f) == params.size() &&
            std::fread(m.data(), sizeof(float), m.size(), f) == m.size() &&
            std::fread(v.data(), sizeof(float), v.size(), f) == v.size() &&
            std::fread(&state, sizeof(state), 1, f) == 1;
  std::fclose(f);
  if (!ok) return DataLossError(path + ": truncated");
  if (state.magic != TrainState::kMagic) return DataLossError(path + ": bad state magic");
  // Copy into the existing buffers: their addresses may be registered.
  std::copy(params.begin(), params.end(), params_.begin());
  std::copy(m.begin(), m.end(), m_.begin());
  std::copy(v.begin(), v.end(), v_.begin());
  state_ = state;
  return Status::Ok();
}

Result<int64_t> Trainer::SavedStep(const std::string& path) const {
  FILE* f = nullptr;
  MEMENTO_RETURN_IF_ERROR(OpenSaved(path, &f));
  const long at = static_cast<long>(sizeof(SaveHeader) +
                                    (params_.size() + m_.size() + v_.size()) * sizeof(float));
  TrainState state;
  const bool ok = std::fseek(f, at, SEEK_SET) == 0 && std::fread(&state, sizeof(state), 1, f) == 1;
  std::fclose(f);
  if (!ok) return DataLossError(path + ": truncated");
  if (state.magic != TrainState::kMagic) return DataLossError(path + ": bad state magic");
  return state.step;
}

uint64_t Trainer::StateChecksum() const {
  uint64_t h = Checksum(params_.data(), params_.size() * sizeof(float));
  h = ChecksumWithSeed(m_.data(), m_.size() * sizeof(float), h);
  h = ChecksumWithSeed(v_.data(), v_.size() * sizeof(float), h);
  return ChecksumWithSeed(&state_, sizeof(state_), h);
}

}  // namespace memento::trainer
