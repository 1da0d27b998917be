from textstats import word_count


def test_single_spaces():
    assert word_count("a b c") == 3
