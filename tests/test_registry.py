import sys
import textwrap

import pytest

from lift3d import registry
from lift3d.registry import RegistryError, find, register


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
