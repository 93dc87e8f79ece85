"""HTML reports: the page toolkit, the page of a decomposition run and the page of the demo."""
