"""Reports: what a compile did, how well, and what it cost (Markdown and HTML, with inline SVG charts)."""
