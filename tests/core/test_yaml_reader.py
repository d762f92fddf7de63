"""The one YAML reader (configuration and scenarios): libyaml's C loader when present, safe either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spotgpu.core.configfile import ConfigError, read_yaml

DOC = "a: 1\nb: [x, 2.5, {c: true}]\nd: null\nwhen: 2020-05-04\n"


def test_uses_the_c_loader_when_pyyaml_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML built without libyaml")
    expected = yaml.safe_load(DOC)
    used: list[type] = []
    real = yaml.load

    def spy(stream: str, Loader: type) -> object:
        used.append(Loader)
        return real(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "load", spy)
    path = tmp_path / "c.yaml"
    path.write_text(DOC)
    assert read_yaml(path) == expected
    assert used == [yaml.CSafeLoader]


def test_falls_back_to_the_python_loader_with_the_same_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "py.yaml"
    path.write_text(DOC)
    with_c = read_yaml(path)
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert read_yaml(path) == with_c == yaml.safe_load(DOC)


@pytest.mark.parametrize("c_loader", [True, False])
def test_python_object_tags_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, c_loader: bool) -> None:
    if not c_loader:
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    path = tmp_path / "evil.yaml"
    path.write_text("x: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(ConfigError, match=r"evil\.yaml: not valid YAML"):
        read_yaml(path)
    assert not (tmp_path / "pwned").exists()
