// memento bench torch: runs examples/torch/bench.py (docs/python.md,
// "Benchmark"): a PyTorch GPT trained with no checkpointing, with memento
// snapshots, with torch.save to /dev/shm and with a blocking copy, every step,
// interleaved in the same run. Prints the script's JSON object (with "schema").
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/command.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct Args {
  std::string preset = "bench";
  int steps = 4;
  int rounds = 3;
  int warmup = 1;
  int threads = 0;
  bool json = false;
};

int RunBenchTorch(const Args& a) {
  const char* py_env = std::getenv("MEMENTO_PYTHON");
  std::string python = py_env && *py_env                         ? py_env
                       : ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3"
                                                                 : "python3";
  std::string script = std::string(MEMENTO_SOURCE_DIR) + "/examples/torch/bench.py";
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return ReportStatus(ErrnoError("readlink /proc/self/exe", errno));
  self[n] = '\0';
  // The build tree's Python package first, then whatever PYTHONPATH has.
  std::string path = std::string(MEMENTO_BINARY_DIR) + "/python";
  if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp) path += std::string(":") + pp;
  ::setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> argv = {python,          script,
                                   "--preset",      a.preset,
                                   "--steps",       std::to_string(a.steps),
                                   "--rounds",      std::to_string(a.rounds),
                                   "--warmup",      std::to_string(a.warmup),
                                   "--threads",     std::to_string(a.threads),
                                   "--memento-bin", self};
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  // The script's stdout is read through a pipe so that its JSON object is
  // printed in the command line's style (one line, with "schema"); its
  // stderr passes through.
  int fds[2];
  if (::pipe(fds) != 0) return ReportStatus(ErrnoError("pipe", errno));
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return ReportStatus(ErrnoError("fork", errno));
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr,
                 "memento bench torch: cannot run %s (%s); it needs Debian's python3-torch "
                 "(scripts/setup.sh) or MEMENTO_PYTHON naming a Python with torch\n",
                 python.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r > 0) {
      out.append(buf, static_cast<size_t>(r));
    } else if (r == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (code != 0 || !j.is_object()) {
    std::fputs(out.c_str(), stdout);
    if (code == 0) {
      std::fprintf(stderr, "memento bench torch: %s printed no JSON object\n", script.c_str());
      return 1;
    }
    return code;
  }
  PrintJson("memento.bench.torch/1", std::move(j));
  return 0;
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto* cmd = bench.add_subcommand(
      "torch",
      "PyTorch GPT on CPU: step time and time blocked per step with no checkpointing, memento "
      "snapshots, torch.save to /dev/shm and a blocking copy, every step, in the same run "
      "(examples/torch/bench.py; needs python3-torch)");
  static Args a;
  cmd->add_option("--preset", a.preset, "Model size: tiny, small, bench (~92M parameters)")
      ->default_val("bench");
  cmd->add_option("--steps", a.steps, "Measured steps per mode and round")->default_val(4);
  cmd->add_option("--rounds", a.rounds, "Rounds (modes interleaved in each)")->default_val(3);
  cmd->add_option("--warmup", a.warmup, "Unmeasured steps before each mode's round")
      ->default_val(1);
  cmd->add_option("--threads", a.threads, "torch threads (0: torch's default)")->default_val(0);
  cmd->add_flag("--json", a.json, "JSON output (the only format)");
  cmd->callback([&ctx] { ctx.exit_code = RunBenchTorch(a); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(torch, memento::tools::Setup);
