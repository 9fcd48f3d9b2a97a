name = "app"
