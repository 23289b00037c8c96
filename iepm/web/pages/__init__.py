"""One module per page: each builds its page's figures (typed tables and charts) from the
archive; the routers in iepm.web.site render them."""
