from dpsynth.cli import app

app()
