"""``python -m spotgpu`` runs the ``spotgpu`` CLI."""

from spotgpu.cli import main

raise SystemExit(main())
