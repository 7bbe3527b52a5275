"""The tree's own checks (scripts/check_layers.py, scripts/check_sizes.py): they pass on this
tree, and each fails on a tree made to break it, naming what broke it."""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ROOT / "scripts" / "check_layers.py"
SIZES = ROOT / "scripts" / "check_sizes.py"


def run(script, root):
    p = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def function(name, body_lines):
    return f"int {name}(int a) {{\n" + "  a += 1;\n" * body_lines + "  return a;\n}\n"


class LayersTest(unittest.TestCase):
    def test_this_tree_keeps_its_layers(self):
        rc, out = run(LAYERS, ROOT)
        self.assertEqual(rc, 0, out)

    def test_an_upward_include_fails_naming_the_file_and_line(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            write(root, "util/ok.h", '#include "util/status.h"\n#include "ckptdb/ckptdb.h"\n')
            write(root, "format/bad.cc", '#include "util/status.h"\n#include "engine/db.h"\n')
            write(root, "tools/bad.cc", '#include "engine/cluster.h"\n')
            rc, out = run(LAYERS, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("format/bad.cc:2: format/ includes engine/", out)
            self.assertIn("tools/bad.cc:1: tools/ includes engine/", out)
            self.assertNotIn("util/ok.h", out)

    def test_a_c_api_function_defined_below_the_engine_fails(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            write(root, "util/status.cc",
                  'extern "C" const char* ckptdb_status_name(int status) {\n  return "";\n}\n'
                  "void F() {\n  ckptdb_status_name(0);\n}\n")
            write(root, "engine/c_api.cc", "int ckptdb_commit(ckptdb* db,\n  int v) {\n}\n")
            rc, out = run(LAYERS, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("util/status.cc:1: defines a C API function outside engine/", out)
            self.assertNotIn("util/status.cc:5", out)
            self.assertNotIn("engine/c_api.cc", out)


class SizesTest(unittest.TestCase):
    def test_this_tree_keeps_to_its_baseline(self):
        rc, out = run(SIZES, ROOT)
        self.assertEqual(rc, 0, out)

    def make(self, root, baseline):
        write(root, "engine/big.cc", "// a file\n" * 901)
        write(root, "transport/long.cc",
              "namespace x {\n\n" + function("Short", 10) + "\n" + function("Long", 125) +
              "\n}  // namespace x\n")
        write(root, "scripts/size_baseline.txt", baseline)

    def test_a_new_offender_fails_and_every_offender_is_listed(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            self.make(root, "file engine/big.cc 901\n")
            rc, out = run(SIZES, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("file engine/big.cc 901 (baseline 901)\n", out)
            self.assertIn("function transport/long.cc:Long 128 (baseline -)  <- NEW OR GROWN", out)
            self.assertNotIn("Short", out)

    def test_offenders_at_their_baseline_pass_grown_ones_fail(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            self.make(root, "file engine/big.cc 901\nfunction transport/long.cc:Long 128\n")
            rc, out = run(SIZES, root)
            self.assertEqual(rc, 0, out)
            self.make(root, "file engine/big.cc 900\nfunction transport/long.cc:Long 128\n")
            rc, out = run(SIZES, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("file engine/big.cc 901 (baseline 900)  <- NEW OR GROWN", out)

    def test_a_long_function_after_a_constructor_with_an_empty_body_is_named_as_itself(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            write(root, "engine/c.cc", "C::C(int a,\n         int b)\n    : a_(a), b_(b) {}\n\n" +
                  function("C::Start", 125))
            write(root, "scripts/size_baseline.txt", "")
            rc, out = run(SIZES, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("function engine/c.cc:C::Start 128 (baseline -)", out)
            self.assertNotIn("C::C ", out)

    def test_a_baseline_entry_that_is_no_longer_an_offender_must_leave(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            self.make(root, "file engine/big.cc 901\nfunction transport/long.cc:Long 128\n"
                            "file engine/gone.cc 1000\n")
            rc, out = run(SIZES, root)
            self.assertEqual(rc, 1, out)
            self.assertIn("file engine/gone.cc: within the bounds now", out)


if __name__ == "__main__":
    unittest.main()
