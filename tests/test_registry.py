import sys
import textwrap
from types import SimpleNamespace

import pytest

from lift3d import registry
from lift3d.registry import RegistryError, find, register
from tests.conftest import REPO


def test_register_and_find():
    @register("test-registry-thing")
    class Thing:
        pass

    assert find("test-registry-thing") is Thing
    assert Thing.registered_name == "test-registry-thing"


def test_miss_lists_names_and_suggests():
    with pytest.raises(RegistryError) as error:
        find("random-view")
    message = str(error.value)
    assert "Did you mean 'random-views'" in message
    assert "posed-images" in message


def test_two_classes_cannot_share_a_name():
    @register("test-registry-dup")
    class A:
        pass

    with pytest.raises(RegistryError, match="registered twice"):

        @register("test-registry-dup")
        class B:
            pass


def test_entry_point_plugin_registers_without_touching_lift3d(tmp_path, monkeypatch):
    # a minimal installed distribution: a module plus a dist-info declaring the entry point
    package = tmp_path / "my_lift3d_plugin.py"
    package.write_text(
        textwrap.dedent(
            """
            from lift3d.base import BaseModule
            from lift3d.registry import register

            @register("plugin-geometry")
            class PluginGeometry(BaseModule):
                pass
            """
        )
    )
    dist = tmp_path / "my_lift3d_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lift3d-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lift3d.modules]\nmy_plugin = my_lift3d_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded_entry_points", False)
    cls = find("plugin-geometry")
    assert cls.__module__ == "my_lift3d_plugin"
    assert "plugin-geometry" in registry.registered_names()
    sys.modules.pop("my_lift3d_plugin", None)


@pytest.fixture
def scratch(monkeypatch):
    """The registry with every built-in loaded; what a test registers vanishes after it."""
    for kind in registry.KINDS:
        registry.entries(kind)
    monkeypatch.setattr(registry, "_entries", {kind: dict(table) for kind, table in registry._entries.items()})


def test_every_kind_holds_its_builtins():
    assert {"random-views", "posed-images"} <= set(registry.entries("part"))
    assert list(registry.entries("capture-format"))[:3] == ["blender", "transforms", "colmap"]  # by priority
    assert {".ply", ".spz", ".sog", ".glb", ".ksplat", ".splat"} <= set(registry.entries("gaussian-codec"))
    assert list(registry.entries("export-format"))[:3] == ["glb", "obj", "mesh-ply"]  # registration order
    assert registry.owners("export-format")["spz"] == "lift3d.export.formats"
    assert registry.owners("part")["random-views"].startswith("lift3d.data.")


def test_objects_register_by_kind_and_order_by_priority(scratch):
    late = registry.register_entry("capture-format", "test-late", SimpleNamespace(name="test-late", priority=92))
    early = registry.register_entry("capture-format", "test-early", SimpleNamespace(name="test-early"), priority=1)
    names = list(registry.entries("capture-format"))
    assert names[0] == "test-early" and names.index("photos") < names.index("test-late") < names.index("video")
    assert registry.find("test-late", kind="capture-format") is late and registry.find("test-early", "capture-format") is early

    @register("test-kind-class", kind="export-format")
    class Writer:
        pass

    assert registry.find("test-kind-class", "export-format") is Writer and Writer.registered_name == "test-kind-class"
    with pytest.raises(RegistryError, match="no part is registered as 'test-kind-class'"):
        find("test-kind-class")  # kinds are separate name spaces
    registry.register_entry("part", "test-early", object())  # the same name in another kind is no clash


def test_a_miss_names_the_closest_name_of_its_kind():
    with pytest.raises(RegistryError) as error:
        find("blendr", kind="capture-format")
    message = str(error.value)
    assert message.startswith("no capture format is registered as 'blendr'. Did you mean 'blender'?")
    assert "colmap" in message and "random-views" not in message
    with pytest.raises(RegistryError, match="Did you mean '.spz'"):
        find(".spx", kind="gaussian-codec")
    with pytest.raises(RegistryError, match="unknown registry kind 'capture-formats'.*capture-format"):
        registry.entries("capture-formats")


def test_a_clash_names_both_owners_and_a_reimport_replaces(scratch):
    first = registry.register_entry("gaussian-codec", ".test", SimpleNamespace(), owner="plugin_a")
    with pytest.raises(RegistryError) as error:
        registry.register_entry("gaussian-codec", ".test", SimpleNamespace(), owner="plugin_b")
    assert str(error.value) == ("Gaussian file codec '.test' is registered twice: by plugin_a and by plugin_b; "
                                "rename one of them")
    assert registry.find(".test", "gaussian-codec") is first
    again = registry.register_entry("gaussian-codec", ".test", SimpleNamespace(), owner="plugin_a")  # plugin_a imported again
    assert registry.find(".test", "gaussian-codec") is again
    with pytest.raises(RegistryError, match=r"capture format 'blender' is registered twice: by lift3d.data.formats.blender "
                                            r"and by (tests\.)?test_registry;"):
        registry.register_entry("capture-format", "blender", SimpleNamespace(priority=1))


def test_the_docs_list_every_builtin_export_format():

    section = (REPO / "docs" / "export.md").read_text().split("## Formats", 1)[1]
    section = section.split("\n## ", 1)[0]
    missing = [name for name in registry.entries("export-format") if f"`{name}`" not in section]
    assert not missing, f"docs/export.md's Formats section does not name {missing}"
