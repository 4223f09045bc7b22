"""The model configs of training/configs, by their names and by the earlier names kept as aliases."""

from __future__ import annotations

import json

import pytest

from training.recipe import CONFIG_ALIASES, CONFIG_DIR, model_config


def test_the_32px_config_is_named_for_what_it_is_and_its_old_name_still_works() -> None:
    config = model_config("vit-tiny-32")
    assert config["vision_cfg"]["image_size"] == 32 and config["vision_cfg"]["layers"] == 4
    assert model_config("fashion-tiny") == config  # the name docs/tutorial.md used before
    assert not (CONFIG_DIR / "fashion-tiny.json").exists()


@pytest.mark.parametrize("alias", sorted(CONFIG_ALIASES))
def test_every_alias_names_a_config_that_exists(alias: str) -> None:
    target = CONFIG_DIR / f"{CONFIG_ALIASES[alias]}.json"
    assert target.exists() and model_config(alias) == json.loads(target.read_text())


def test_an_unknown_name_is_an_error_that_says_where_it_looked() -> None:
    with pytest.raises(ValueError, match="no model config 'vit-tiny-33'"):
        model_config("vit-tiny-33")
