"""What is chosen in the app (theme, sort, history window) saved to the config file.

The next start reads them back like any other setting (verl_top/settings.py). Writes run in a
worker thread (the UI never waits on the disk), one at a time and in order, touch only those
keys' lines and are atomic; a file that cannot be edited that way is left alone and the app
says so once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from verl_top.settings import SettingsError, save_ui_settings


class UiSettingsSaver:
    """Saves the app's choices to ``path`` (None: never saves, as in tests and screenshots)."""

    def __init__(self, app: Any, path: Path | None) -> None:
        self.app = app
        self.path = path
        self.theme: str | None = None  # the theme at start: its own change signal is no choice
        self._failed = False
        # Choices not written yet (the latest value of each key) and whether a writer runs:
        # each write reads and edits the file, so two at once could lose one, or let an older
        # choice land last (o o O saved the sort unreversed once, in a loaded test run).
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._writing = False

    def start(self, theme: str) -> None:
        """Remember the theme the app starts with."""
        self.theme = theme

    def theme_changed(self, name: str) -> None:
        """A theme was picked (command palette): saved when its name works at the next start."""
        from verl_top.ui.themes import ThemeError, check_theme_arg

        if name == self.theme:
            return
        self.theme = name
        try:
            check_theme_arg(name)
        except ThemeError:
            return  # registered from a theme file given by path: the name alone would not load
        self.save(theme=name)

    def save(self, **values: Any) -> None:
        """Write ``values`` (settings.UI_KEYS) in a worker thread, after any write in flight."""
        if self.path is None:
            return
        path = self.path
        with self._lock:
            self._pending.update(values)
            if self._writing:
                return  # the running writer takes these up when its write is done
            self._writing = True
        self.app.run_worker(
            lambda: self._drain(path), thread=True, group="ui-settings", exit_on_error=False
        )

    def _drain(self, path: Path) -> None:
        """Write what is pending until nothing is: one writer, the latest value of each key."""
        while True:
            with self._lock:
                values, self._pending = self._pending, {}
                if not values:
                    self._writing = False
                    return
            self._write(path, values)

    def _write(self, path: Path, values: dict[str, Any]) -> None:
        try:
            save_ui_settings(path, values)
        except Exception as exc:  # noqa: BLE001 - the writer must go on (and say why once)
            if not isinstance(exc, SettingsError):
                exc = SettingsError(f"{path}: {type(exc).__name__}: {exc}")
            if not self._failed:  # once: the choice still applies to this session
                self._failed = True
                self.app.call_from_thread(
                    self.app.notify, str(exc), severity="warning", timeout=10, markup=False
                )
