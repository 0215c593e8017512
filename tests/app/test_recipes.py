"""The app's recipe table: probing which keys a config accepts, overrides from the page's options, quoting."""

import pytest
from omegaconf import OmegaConf

from lift3d.app.recipes import (
    PROMPT,
    RECIPES_ENV,
    AppRecipe,
    RecipeError,
    _config_path,
    build_overrides,
    default_recipes,
    find_recipe,
    load_recipe_file,
    probe_recipe,
    quote,
    recipe_from_dict,
    recipe_table,
)
from lift3d.config import load_config
from tests.conftest import TEST_CONFIGS

APP_MESH = TEST_CONFIGS / "app-mesh.yaml"


def _test_recipe(**changes) -> AppRecipe:
    fields = dict(label="Test sphere", configs=(str(APP_MESH),), input=PROMPT, input_keys=("system.prompt",),
                  options={"steps": ("trainer.max_steps",), "seed": ("seed",),
                           "resolution": ("system.resolution", "system.no_such_key"),
                           "guidance_scale": ("system.guidance.guidance_scale",)})
    fields.update(changes)
    return AppRecipe(**fields)


@pytest.mark.parametrize("text", ["a cat, sitting: on a mat", "[x]", "null", "123", "it's \"quoted\"", "${oops}",
                                  "a=b", "#tag", "yes", "C:\\models\\sd", "  two\n lines  "])
def test_quote_keeps_any_prompt_verbatim(text):
    node = OmegaConf.from_dotlist([f"k={quote(text)}"])
    assert OmegaConf.to_container(node, resolve=True)["k"] == " ".join(text.split())


@pytest.fixture(scope="module")
def offered():
    return probe_recipe(_test_recipe())


def test_probe_keeps_only_the_keys_the_config_accepts(offered):
    assert offered is not None and offered.name == "app-mesh" and offered.config_path == APP_MESH.resolve()
    assert offered.input_keys == ("system.prompt",)
    # resolution keeps its one valid key; guidance_scale (no such key in this recipe) is not offered at all
    assert dict(offered.option_keys) == {"steps": ("trainer.max_steps",), "seed": ("seed",), "resolution": ("system.resolution",)}
    assert offered.defaults == {"steps": 60, "seed": 0, "resolution": 16}  # from the YAML chain (app-mesh <- fit-image)


def test_recipes_without_a_config_or_an_input_key_are_not_offered(tmp_path):
    assert probe_recipe(_test_recipe(configs=("no-such-recipe", str(tmp_path / "missing.yaml")))) is None
    assert probe_recipe(_test_recipe(input_keys=("system.nope",))) is None
    # the first existing config of the list is used
    offered = probe_recipe(_test_recipe(configs=("no-such-recipe", str(APP_MESH))))
    assert offered is not None and offered.config_path == APP_MESH.resolve()


def test_overrides_send_set_options_the_recipe_supports_and_load(offered):
    overrides = build_overrides(offered, "a red: apple #1", {"steps": "7", "seed": "", "resolution": 8.0,
                                                            "guidance_scale": "12", "model_path": None})
    assert not any("guidance" in o or o.startswith("seed=") for o in overrides)  # unsupported and blank are not sent
    cfg = load_config(APP_MESH, overrides=overrides)
    assert cfg.trainer.max_steps == 7 and cfg.system["resolution"] == 8 and cfg.system["prompt"] == "a red: apple #1"


@pytest.mark.parametrize("option, value, message", [
    ("steps", "abc", "must be a number"), ("steps", "0", "between 1"), ("steps", "2.5", "whole number"),
    ("seed", -1, "between 0"), ("resolution", "nan", "finite"), ("guidance_scale", "-3", "between 0"),
])
def test_bad_option_values_are_refused(offered, option, value, message):
    with pytest.raises(RecipeError, match=message):
        build_overrides(offered, "x", {option: value})


def test_unknown_recipe_names_the_offered_ones(offered):
    assert find_recipe([offered], "Test sphere") is offered
    with pytest.raises(RecipeError, match="unknown recipe 'Nope'.*'Test sphere'"):
        find_recipe([offered], "Nope")


def test_recipe_files_and_the_environment_extend_the_table(tmp_path, monkeypatch):
    file = tmp_path / "recipes.yaml"
    file.write_text(
        "- label: Mine\n  config: ../configs/app-mesh.yaml\n  input_keys: [system.prompt]\n"
        "  options: {steps: trainer.max_steps}\n  export_formats: [glb, ply]\n"
    )
    (tmp_path / "configs").mkdir()
    plugins = str(TEST_CONFIGS.parent / "plugins")
    (tmp_path / "configs" / "app-mesh.yaml").write_text(APP_MESH.read_text().replace("../plugins", plugins))
    [recipe] = load_recipe_file(file)
    assert recipe.configs == (str(tmp_path / "../configs/app-mesh.yaml"),) and recipe.options == {"steps": ("trainer.max_steps",)}
    assert recipe.export_formats == ("glb", "ply")
    monkeypatch.setenv(RECIPES_ENV, str(file))
    labels = [r.label for r in recipe_table()]
    assert labels[: len(default_recipes())] == [r.label for r in default_recipes()] and labels[-1] == "Mine"
    with pytest.raises(RecipeError, match="unknown field.*color"):
        recipe_from_dict({"label": "x", "config": "y", "color": "red"})
    with pytest.raises(RecipeError, match="unknown option"):
        recipe_from_dict({"label": "x", "config": "y", "options": {"stpes": "trainer.max_steps"}})
    with pytest.raises(RecipeError, match="not found"):
        load_recipe_file(tmp_path / "missing.yaml")


def test_built_in_table_matches_the_installed_recipe_configs():
    # a built-in entry whose recipe config is installed must be offered with every option it lists: a key that
    # a recipe renamed fails here rather than silently dropping the option from the page
    for recipe in default_recipes():
        if _config_path(recipe) is None:
            continue
        offered = probe_recipe(recipe)
        assert offered is not None, f"{recipe.label}: its config does not accept its input keys {recipe.input_keys}"
        assert set(offered.option_keys) == set(recipe.options), recipe.label
        for option, keys in recipe.options.items():
            assert offered.option_keys[option] == keys, (recipe.label, option)
