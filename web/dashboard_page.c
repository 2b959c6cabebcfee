/* placeholder */
#include "web/web_int.h"
const char web_dashboard_html[] = "<!doctype html><title>shoal</title>";
