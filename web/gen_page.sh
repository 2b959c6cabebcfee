#!/bin/sh
# gen_page.sh: regenerates web/dashboard_page.c from web/dashboard.html (the page is compiled
# into the binary as one C string, so the build needs no generator step).
# Run from the repository root after editing the page: sh web/gen_page.sh
# tests/test_web.c checks that the two agree.
set -eu
out=web/dashboard_page.c
{
	echo '/* dashboard_page.c: GENERATED from web/dashboard.html by web/gen_page.sh; edit the .html. */'
	echo '#include "web/web_int.h"'
	echo
	echo 'const char web_dashboard_html[] ='
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$/\\n"/' web/dashboard.html
	echo '\t;'
} >"$out.tmp"
mv "$out.tmp" "$out"
