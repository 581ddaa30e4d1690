"""python_module_test: the extension itself (no torch needed): errors, dtypes, a raw client."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

import memento  # noqa: E402
from memento import _memento  # noqa: E402


class ModuleTest(unittest.TestCase):
    def test_error_carries_code_and_message(self):
        d = agent_util.tmpdir("noagent-")
        with self.assertRaises(memento.Error) as cm:
            memento.Client.connect("job", agent_dir=d, connect_timeout_s=0.2)
        # A directory without a running agent: Unavailable, naming it.
        self.assertEqual(cm.exception.code, "Unavailable")
        self.assertIn(d, cm.exception.message)
        self.assertIsInstance(cm.exception, RuntimeError)
        # No agent directory at all: NotFound, naming the command that creates it.
        with self.assertRaises(memento.Error) as cm:
            memento.Client.connect("job", agent_dir=d + "/absent", connect_timeout_s=0.2)
        self.assertEqual(cm.exception.code, "NotFound")
        self.assertIn("memento agent", cm.exception.message)
        self.assertIsInstance(cm.exception, RuntimeError)

    def test_dtypes(self):
        self.assertEqual(_memento.dtype_size("bfloat16"), 2)
        self.assertEqual(_memento.dtype_name("float32"), "F32")
        with self.assertRaises(memento.Error) as cm:
            _memento.dtype_size("complex64")
        self.assertEqual(cm.exception.code, "InvalidArgument")

    def test_raw_client_roundtrip(self):
        import array

        with agent_util.Agent("pymod") as agent:
            c = memento.Client.connect("pymod", agent_dir=agent.root)
            buf = array.array("f", [float(i) for i in range(1024)])
            addr, n = buf.buffer_info()
            with self.assertRaises(memento.Error) as cm:
                c.register_tensor("w", "F32", [1024], "private", addr, n * 4 + 4)
            self.assertEqual(cm.exception.code, "InvalidArgument")
            c.register_tensor("w", "F32", [1024], "private", addr, n * 4)
            c.seal()
            self.assertIsNone(c.restore())
            c.snapshot(7)
            c.fence()
            self.assertEqual(c.last_snapshot_stats()["bytes"] >= 4096, True)
            for i in range(1024):
                buf[i] = -1.0
            self.assertEqual(c.restore(), 7)
            self.assertEqual(list(buf), [float(i) for i in range(1024)])
            self.assertEqual([v["step"] for v in c.versions()], [7])
            with self.assertRaises(memento.Error) as cm:
                c.restore(3)
            self.assertEqual(cm.exception.code, "NotFound")
            c.close()
            with self.assertRaises(memento.Error) as cm:
                c.snapshot(8)
            self.assertEqual(cm.exception.code, "FailedPrecondition")


    def test_device_tensors_are_refused_with_a_reason(self):
        import array

        with agent_util.Agent("pydev") as agent:
            c = memento.Client.connect("pydev", agent_dir=agent.root)
            buf = array.array("f", [0.0] * 256)
            addr, n = buf.buffer_info()
            with self.assertRaises(memento.Error) as cm:
                c.register_tensor("w", "F32", [256], "private", addr, n * 4, device_type="xpu")
            self.assertEqual(cm.exception.code, "InvalidArgument")
            self.assertIn("xpu", cm.exception.message)
            if memento.HAVE_CUDA and not os.path.exists("/dev/nvidia0"):
                # Without a GPU the CUDA path refuses and says why.
                with self.assertRaises(memento.Error) as cm:
                    c.register_tensor("w", "F32", [256], "private", addr, n * 4, device_type="cuda")
                self.assertEqual(cm.exception.code, "FailedPrecondition")
                self.assertIn("no CUDA device", cm.exception.message)
            c.close()


if __name__ == "__main__":
    unittest.main()
