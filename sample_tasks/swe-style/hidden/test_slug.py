import unittest

from slug import slugify


class SlugifyTest(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_and_spaces(self):
        self.assertEqual(slugify("  Fix: the  bug!! "), "fix-the-bug")

    def test_max_length(self):
        self.assertEqual(slugify("a" * 100, max_length=10), "a" * 10)

    def test_no_trailing_dash_after_cut(self):
        self.assertEqual(slugify("abc def", max_length=4), "abc")


if __name__ == "__main__":
    unittest.main()
