"""``sinklab report`` (``gather``: every study folder's report in one Markdown file and HTML page)
and the Markdown helpers the reports are written with (``markdown``)."""
