import pytest

from simbridge.server.mapping import parse_rules, pattern_mapping


def test_first_matching_glob_wins_else_default():
    fn = pattern_mapping(parse_rules(["player_*=nim", "cart_[02]=even", "cart_*=odd"]))
    assert fn("player_1") == "nim"
    assert fn("cart_0") == "even" and fn("cart_1") == "odd" and fn("cart_2") == "even"
    assert fn("agent0") == "default_policy"


def test_bad_rule_names_the_form():
    with pytest.raises(ValueError, match="PATTERN=POLICY"):
        parse_rules(["player_*"])
