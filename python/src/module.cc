// memento._memento: the pybind11 extension over the public C++ API
// (include/memento/client.h). The pure-Python layer (memento/*.py) builds the
// user-facing API on it; docs/python.md.
//
// Tensors are registered by address: Python passes a tensor's data_ptr() and
// byte size, and the copy engine reads that memory directly (no copy in
// Python). The caller keeps the memory alive and in place while the Client
// exists (memento.torch.Checkpointer holds references to the tensors).
//
// Errors: every non-OK Status raises memento.Error (defined here) with
// .code ("NotFound", "DataLoss", ...) and .message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memento/client.h"
#include "memento/config.h"
#include "memento/status.h"
#include "memento/types.h"
#include "tier/env.h"
#include "tier/export.h"
#include "tier/reader.h"

namespace py = pybind11;

namespace memento::python {
namespace {

PyObject* g_error = nullptr;  // memento.Error

[[noreturn]] void Raise(const Status& status) {
  py::object type = py::reinterpret_borrow<py::object>(g_error);
  py::object err = type(status.ToString());
  err.attr("code") = std::string(StatusCodeName(status.code()));
  err.attr("message") = status.message();
  PyErr_SetObject(g_error, err.ptr());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Take(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(*result);
}

DType ToDType(const std::string& name) { return Take(ParseDType(name)); }

StateClass ToStateClass(const std::string& name) { return Take(ParseStateClass(name)); }

Device ToDevice(const std::string& type, int index) {
  if (type == "cpu") return Device::Host();
  if (type == "cuda") return Device::Cuda(index);
  Raise(InvalidArgumentError("device type '" + type + "' is not supported (expected cpu or cuda)"));
}

Phase ToPhase(const std::string& name) {
  if (name == "compute") return Phase::kCompute;
  if (name == "idle") return Phase::kIdle;
  if (name == "communicate") return Phase::kCommunicate;
  Raise(InvalidArgumentError("phase '" + name +
                             "' is unknown (expected compute, idle or communicate)"));
}

// The Python-side Client: owns the C++ Client. Blocking calls release the GIL.
class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  Client& get() {
    if (!client_) Raise(FailedPreconditionError("the client is closed"));
    return *client_;
  }

  void Close() {
    py::gil_scoped_release release;
    client_.reset();
  }

  void RegisterTensor(const std::string& name, const std::string& dtype,
                      const std::vector<int64_t>& shape, const std::string& state_class,
                      uintptr_t address, uint64_t nbytes, const std::string& device_type,
                      int device_index, int64_t global_numel, int64_t shard_offset) {
    TensorMeta meta;
    meta.name = name;
    meta.dtype = ToDType(dtype);
    meta.shape = shape;
    meta.state_class = ToStateClass(state_class);
    meta.global_numel = global_numel;
    meta.shard_offset = shard_offset;
    if (meta.nbytes() != nbytes) {
      Raise(InvalidArgumentError("tensor '" + name + "': " + std::to_string(nbytes) +
                                 " bytes given, but dtype " + dtype + " and shape " +
                                 ShapeToString(shape) + " need " + std::to_string(meta.nbytes())));
    }
    if (address == 0 && nbytes != 0) {
      Raise(InvalidArgumentError("tensor '" + name + "': null address"));
    }
    Check(get().RegisterTensor(meta, reinterpret_cast<void*>(address),
                               ToDevice(device_type, device_index)));
  }

  void RegisterBlob(const std::string& name, uintptr_t address, uint64_t nbytes) {
    if (address == 0) Raise(InvalidArgumentError("blob '" + name + "': null address"));
    Check(get().RegisterBlob(name, reinterpret_cast<void*>(address), nbytes));
  }

  void Seal() {
    Client& c = get();
    Status st;
    {
      py::gil_scoped_release release;
      st = c.Seal();
    }
    Check(st);
  }

  void Snapshot(int64_t step) {
    Client& c = get();
    Status st;
    {
      py::gil_scoped_release release;
      st = c.Snapshot(step);
    }
    Check(st);
  }

  void Fence(std::optional<double> timeout_s) {
    Client& c = get();
    Status st;
    {
      py::gil_scoped_release release;
      st = c.Fence(timeout_s ? Deadline::AfterSeconds(*timeout_s) : Deadline::Infinite());
    }
    Check(st);
  }

  // None when no version exists (NotFound) and no step was asked for.
  std::optional<int64_t> Restore(std::optional<int64_t> step) {
    Client& c = get();
    Result<int64_t> r = NotFoundError("");
    {
      py::gil_scoped_release release;
      r = step ? c.Restore(*step) : c.Restore();
    }
    if (!r.ok() && !step && r.status().code() == StatusCode::kNotFound) return std::nullopt;
    return Take(std::move(r));
  }

  py::list Versions() {
    Client& c = get();
    Result<std::vector<VersionInfo>> r = std::vector<VersionInfo>{};
    {
      py::gil_scoped_release release;
      r = c.ListVersions();
    }
    py::list out;
    for (const VersionInfo& v : Take(std::move(r))) {
      py::dict d;
      d["step"] = v.step;
      d["intact"] = v.intact;
      d["committed"] = v.intact;  // the old name of "intact", kept for callers
      d["bytes"] = v.bytes;
      out.append(d);
    }
    return out;
  }

  void OnPhase(const std::string& phase) { get().OnPhase(ToPhase(phase)); }

  py::dict SnapshotStatsDict() {
    SnapshotStats s = get().LastSnapshotStats();
    py::dict d;
    d["step"] = s.step;
    d["bytes"] = s.bytes;
    d["copy_s"] = s.copy_s;
    d["fence_wait_s"] = s.fence_wait_s;
    d["bytes_idle"] = s.bytes_idle;
    d["bytes_compute"] = s.bytes_compute;
    d["bytes_communicate"] = s.bytes_communicate;
    d["bytes_fence"] = s.bytes_fence;
    d["copy_cpu_s"] = s.copy_cpu_s;
    d["skipped"] = s.skipped;
    d["skipped_total"] = s.skipped_total;
    return d;
  }

  py::dict RestoreStatsDict() {
    RestoreStats s = get().LastRestoreStats();
    py::dict d;
    d["step"] = s.step;
    d["bytes"] = s.bytes;
    d["restore_s"] = s.restore_s;
    d["verify_s"] = s.verify_s;
    d["copy_s"] = s.copy_s;
    d["overwritten"] = s.overwritten;
    d["skipped"] = s.skipped;
    return d;
  }

 private:
  std::unique_ptr<Client> client_;
};

std::unique_ptr<PyClient> Connect(const std::string& job_id, int rank, int world_size,
                                  const std::string& agent_dir, int node, int copy_threads,
                                  uint64_t chunk_bytes, const std::string& copy_priority,
                                  double connect_timeout_s, const std::string& schedule) {
  ClientOptions o;
  o.job_id = job_id;
  o.rank = rank;
  o.world_size = world_size;
  o.agent_dir = agent_dir;
  o.node = node;
  o.copy_threads = copy_threads;
  o.chunk_bytes = chunk_bytes;
  o.copy_priority = Take(ParseCopyPriority(copy_priority));
  o.connect_timeout_s = connect_timeout_s;
  o.schedule = Take(ParseSchedule(schedule));
  Result<std::unique_ptr<Client>> r = UnavailableError("");
  {
    py::gil_scoped_release release;
    r = Client::Connect(o);
  }
  return std::make_unique<PyClient>(Take(std::move(r)));
}

}  // namespace
}  // namespace memento::python

PYBIND11_MODULE(_memento, m) {
  using namespace memento;
  using namespace memento::python;
  m.doc() = "memento C++ client (see the memento package and docs/python.md)";
  m.attr("__version__") = MEMENTO_VERSION_STRING;
  m.attr("HAVE_CUDA") = bool(MEMENTO_HAVE_CUDA);

  py::object base = py::module_::import("builtins").attr("RuntimeError");
  py::dict attrs;
  attrs["__doc__"] =
      "A memento call failed. .code is the Status code name (\"NotFound\", \"DataLoss\", "
      "\"InvalidArgument\", ...), .message the message.";
  attrs["__module__"] = "memento";
  attrs["code"] = "Unknown";
  attrs["message"] = "";
  py::object error = py::reinterpret_borrow<py::object>((PyObject*)&PyType_Type)(
      "Error", py::make_tuple(base), attrs);
  g_error = error.release().ptr();  // lives as long as the module
  m.attr("Error") = py::reinterpret_borrow<py::object>(g_error);

  m.def("dtype_size", [](const std::string& name) { return DTypeSize(ToDType(name)); });
  m.def("dtype_name",
        [](const std::string& name) { return std::string(DTypeName(ToDType(name))); });
  m.def("raise_status", [](const std::string& code, const std::string& message) {
    for (int c = 1; c <= static_cast<int>(StatusCode::kPermissionDenied); ++c) {
      if (StatusCodeName(static_cast<StatusCode>(c)) == code) {
        Raise(Status(static_cast<StatusCode>(c), message));
      }
    }
    Raise(InvalidArgumentError("unknown status code '" + code + "'"));
  });

  // The durable tier (memento.load_durable, `memento export`).
  m.def(
      "durable_versions",
      [](const std::string& root) {
        auto r = tier::ListVersions(tier::Env::Default(), root);
        py::list out;
        for (const auto& v : Take(std::move(r))) {
          py::dict d;
          d["step"] = v.step;
          d["complete"] = v.complete;
          d["state"] = v.state;
          out.append(d);
        }
        return out;
      },
      py::arg("root"));
  m.def(
      "export_safetensors",
      [](const std::string& root, const std::string& out, std::optional<int64_t> step, int rank,
         const std::string& prefix) {
        tier::ExportOptions o;
        o.rank = rank;
        o.prefix = prefix;
        Result<tier::ExportReport> r = NotFoundError("");
        {
          py::gil_scoped_release release;
          r = tier::ExportSafetensors(tier::Env::Default(), root, step, out, o);
        }
        tier::ExportReport rep = Take(std::move(r));
        py::dict d;
        d["step"] = rep.step;
        d["path"] = rep.path;
        d["tensors"] = rep.tensors;
        d["bytes"] = rep.bytes;
        return d;
      },
      py::arg("root"), py::arg("out"), py::arg("step") = py::none(), py::arg("rank") = 0,
      py::arg("prefix") = "");

  py::class_<PyClient>(m, "Client")
      .def_static("connect", &Connect, py::arg("job_id"), py::arg("rank") = 0,
                  py::arg("world_size") = 1, py::arg("agent_dir") = "", py::arg("node") = 0,
                  py::arg("copy_threads") = 1, py::arg("chunk_bytes") = uint64_t{4} << 20,
                  py::arg("copy_priority") = "idle", py::arg("connect_timeout_s") = 10.0,
                  py::arg("schedule") = "auto")
      .def("register_tensor", &PyClient::RegisterTensor, py::arg("name"), py::arg("dtype"),
           py::arg("shape"), py::arg("state_class"), py::arg("address"), py::arg("nbytes"),
           py::arg("device_type") = "cpu", py::arg("device_index") = 0, py::arg("global_numel") = 0,
           py::arg("shard_offset") = 0)
      .def("register_blob", &PyClient::RegisterBlob, py::arg("name"), py::arg("address"),
           py::arg("nbytes"))
      .def("seal", &PyClient::Seal)
      .def("snapshot", &PyClient::Snapshot, py::arg("step"))
      .def("fence", &PyClient::Fence, py::arg("timeout_s") = py::none())
      .def("restore", &PyClient::Restore, py::arg("step") = py::none())
      .def("versions", &PyClient::Versions)
      .def("on_phase", &PyClient::OnPhase, py::arg("phase"))
      .def("last_snapshot_stats", &PyClient::SnapshotStatsDict)
      .def("last_restore_stats", &PyClient::RestoreStatsDict)
      .def("close", &PyClient::Close);
}
