"""The interfaces every plugin implements, and the plain data that crosses between them.

A job reads a :class:`Source`, a :class:`Strategy` splits it into :class:`Partition` s, a
:class:`Runtime` runs one task per partition and each task streams Arrow record batches
from the source into the :class:`Sink`. Everything here that crosses a process boundary
(partitions, plans, stats, plugin objects) is plain, picklable data: connections are opened
inside ``read`` and ``write`` and closed before they return.

The modules: ``options`` (job options, cancellation), ``partitions``, ``sources`` (the source
interface and its defaults), ``splitting`` (what strategies ask of a source), ``cursor``
(incremental windows), ``sinks`` (the sink interface, its plan and capabilities),
``runs`` (strategy, runtime, tasks, progress), ``changes`` (a sync's change feed and change applier).
Import from ``conveyor.core``: the split is ours.
"""

from conveyor.core.changes import *  # noqa: F403
from conveyor.core.changes import __all__ as _changes
from conveyor.core.counting import *  # noqa: F403
from conveyor.core.counting import __all__ as _counting
from conveyor.core.cursor import *  # noqa: F403
from conveyor.core.cursor import __all__ as _cursor
from conveyor.core.migration import *  # noqa: F403
from conveyor.core.migration import __all__ as _migration
from conveyor.core.options import *  # noqa: F403
from conveyor.core.options import __all__ as _options
from conveyor.core.partitions import *  # noqa: F403
from conveyor.core.partitions import __all__ as _partitions
from conveyor.core.runs import *  # noqa: F403
from conveyor.core.runs import __all__ as _runs
from conveyor.core.sinks import *  # noqa: F403
from conveyor.core.sinks import __all__ as _sinks
from conveyor.core.sources import *  # noqa: F403
from conveyor.core.sources import __all__ as _sources
from conveyor.core.splitting import *  # noqa: F403
from conveyor.core.splitting import __all__ as _splitting

__all__ = [*_changes, *_counting, *_cursor, *_migration, *_options, *_partitions, *_sources, *_splitting, *_sinks, *_runs]
