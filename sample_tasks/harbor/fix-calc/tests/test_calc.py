import importlib
import os
import sys
import unittest

sys.path.insert(0, "/app")
calc = importlib.import_module(os.environ.get("CALC_MODULE", "calc"))


class MeanTest(unittest.TestCase):
    def test_integers(self):
        self.assertEqual(calc.mean([1, 2, 3]), 2)

    def test_single(self):
        self.assertEqual(calc.mean([5]), 5)


if __name__ == "__main__":
    unittest.main()
