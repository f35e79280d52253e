"""HTTP routers of the API, one module per resource.

PathId   an id in a URL path (user, inbox item): api.models.PATH_ID_PATTERN, 1-128 characters
"""

from typing import Annotated

from fastapi import Path

from api.models import PATH_ID_PATTERN

PathId = Annotated[str, Path(min_length=1, max_length=128, pattern=PATH_ID_PATTERN)]
