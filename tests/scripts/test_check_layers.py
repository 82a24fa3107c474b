"""scripts/build/check_layers.py, the build's layering check: an include of a room the including room
does not depend on (directly or through its dependencies) fails with a line naming the file, the
include and the rooms allowed; includes within the layers pass and write the stamp."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "scripts", "build", "check_layers.py")
ROOMS = ["core=src/core:", "model=src/model:core", "train=src/train:model"]


class CheckLayers(unittest.TestCase):
    def check(self, files):
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w") as handle:
                    handle.write(text)
            stamp = os.path.join(root, "stamp.h")
            result = subprocess.run([sys.executable, SCRIPT, root, stamp] + ROOMS, capture_output=True, text=True)
            return result, os.path.exists(stamp)

    def test_includes_down_the_layers_pass(self):
        result, stamped = self.check({
            "src/train/loop.cpp": '#include "train/loop.hpp"\n#include "model/layer.hpp"\n#include "core/buffer.hpp"\n',
            "src/model/layer.hpp": '#include <vector>\n#include "core/buffer.hpp"\n'})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(stamped)

    def test_an_include_up_the_layers_fails_the_build(self):
        result, stamped = self.check({
            "src/core/buffer.hpp": '#pragma once\n\n#include "model/layer.hpp"\n',
            "src/model/layer.hpp": '#include "core/buffer.hpp"\n'})
        self.assertEqual(result.returncode, 1)
        self.assertFalse(stamped)
        self.assertIn('src/core/buffer.hpp:3: includes "model/...", but the core room may include only core',
                      result.stderr)

    def test_dependencies_are_transitive_but_not_reversed(self):
        result, _ = self.check({"src/model/layer.cpp": '#include "train/loop.hpp"\n'})
        self.assertEqual(result.returncode, 1)
        self.assertIn("the model room may include only core, model", result.stderr)


if __name__ == "__main__":
    unittest.main()
