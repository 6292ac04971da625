"""What sinklab writes and how: folder markers, locks and completion records (``folders``), run
files written atomically (``files``), and the size limits checked before anything is allocated
(``limits``)."""
